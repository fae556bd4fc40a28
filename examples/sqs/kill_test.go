package main

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/examples/sqs/fauxqs"
	"github.com/oncekit/oncekit/examples/sqs/sqsbroker"
	"github.com/oncekit/oncekit/internal/testkit/brokerkill"
	"github.com/oncekit/oncekit/oncekittest"
)

// The helper processes find fauxqs and the queue in their environment.
const (
	endpointEnv = "SQS_TEST_ENDPOINT"
	queueEnv    = "SQS_TEST_QUEUE"
	fifoEnv     = "SQS_TEST_FIFO"
)

// killAckWait is the consumers' visibility timeout in the kill run: what a
// killed consumer held comes back within 2 s.
const killAckWait = 2 * time.Second

// sqsBroker is the kill run's broker: sqsbroker's publisher and source on
// queue. A FIFO queue keeps each key's order (the key is the message
// group); a standard queue keeps none, and the run reports its order
// violations without failing on them. The run waits for the queue to hold
// nothing (visible, in flight or delayed) before counting, so that every
// copy has reached a consumer.
func sqsBroker(endpoint, queue string, fifo bool) brokerkill.Broker {
	client := fauxqs.Client(endpoint)
	return brokerkill.Broker{
		Name: map[bool]string{false: "sqs-standard", true: "sqs-fifo"}[fifo], Subject: "payments",
		Unordered: !fifo,
		NewPublisher: func(context.Context) (broker.Publisher, func(), error) {
			p, err := sqsbroker.NewPublisher(client, sqsbroker.PublisherConfig{QueueURL: func(string) string { return queue }, FIFO: fifo})
			if err != nil {
				return nil, nil, err
			}
			return p, func() {}, nil
		},
		NewSource: func(context.Context) (broker.Source, func(), error) {
			s, err := sqsbroker.NewSource(client, sqsbroker.SourceConfig{QueueURL: queue, Subject: "payments", FIFO: fifo, AckWait: killAckWait})
			if err != nil {
				return nil, nil, err
			}
			return s, s.Close, nil
		},
		Idle: func(ctx context.Context) (bool, error) { return queueEmpty(ctx, client, queue) },
	}
}

// runKillHelper runs this process as a relay or consumer of
// TestKillsRelayAndConsumers, until it is killed or stopped.
func runKillHelper() error {
	fifo, err := strconv.ParseBool(os.Getenv(fifoEnv))
	if err != nil {
		return err
	}
	return brokerkill.Helper(context.Background(), sqsBroker(os.Getenv(endpointEnv), os.Getenv(queueEnv), fifo))
}

// outbox → relay → SQS → inbox on a standard and a FIFO queue of fauxqs
// (which keeps running), with relay and consumer processes SIGKILLed at
// random moments and at their crash points, and a consumer joining and
// leaving: every event is applied once, and on the FIFO queue in its key's
// (its message group's) order. The standard queue's order violations are
// reported in the summary line, not checked (no order promised).
func TestKillsRelayAndConsumers(t *testing.T) {
	for _, fifo := range []bool{false, true} {
		t.Run(map[bool]string{false: "standard", true: "fifo"}[fifo], func(t *testing.T) {
			t.Parallel()
			fq := fauxqs.Shared(t)
			queue := fauxqs.NewQueue(t, fq.Client(), fifo, nil)
			db := oncekittest.NewDB(t)
			sum, err := brokerkill.Run(context.Background(), brokerkill.Config{
				Broker: sqsBroker(fq.URL, queue, fifo),
				Pool:   db.Pool, URL: db.URL, Schema: db.Schema,
				Command: func() *exec.Cmd {
					cmd := exec.Command(os.Args[0], "-test.run=^$")
					cmd.Env = append(os.Environ(), endpointEnv+"="+fq.URL, queueEnv+"="+queue, fifoEnv+"="+strconv.FormatBool(fifo))
					return cmd
				},
				LogDir: t.TempDir(),
			})
			t.Log(sum)
			require.NoError(t, err)
			require.NoError(t, sum.Failed())
			require.Equal(t, !fifo, sum.Unordered)
			require.Positive(t, sum.RelayKills)
			require.Positive(t, sum.ConsumerKills)
			require.Positive(t, sum.Joins)
			require.Positive(t, sum.Leaves)
		})
	}
}

// queueEmpty reports whether queue holds no message, visible or in flight.
func queueEmpty(ctx context.Context, client *sqs.Client, queue string) (bool, error) {
	out, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(queue), AttributeNames: []types.QueueAttributeName{
		types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
		types.QueueAttributeNameApproximateNumberOfMessagesDelayed,
	}})
	if err != nil {
		return false, err
	}
	for _, v := range out.Attributes {
		if v != "0" {
			return false, nil
		}
	}
	return true, nil
}
