package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/examples/kafka/kafkabroker"
	"github.com/oncekit/oncekit/examples/kafka/kafkatest"
	"github.com/oncekit/oncekit/internal/testkit/brokerkill"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// The helper processes find the cluster and the topic in their environment.
const (
	brokersEnv = "KAFKA_TEST_BROKERS"
	topicEnv   = "KAFKA_TEST_TOPIC"
)

// kafkaBroker is the kill run's broker: the example's publisher and
// consumer group on topic.
func kafkaBroker(brokers []string, topic string) brokerkill.Broker {
	cfg := kafkabroker.Config{Brokers: brokers, Group: "billing", SessionTimeout: testSession}
	return brokerkill.Broker{
		Name: "kafka", Subject: topic,
		NewPublisher: func(context.Context) (broker.Publisher, func(), error) {
			p, err := kafkabroker.NewPublisher(cfg)
			if err != nil {
				return nil, nil, err
			}
			return p, func() { _ = p.Close() }, nil
		},
		NewSource: func(ctx context.Context) (broker.Source, func(), error) {
			s, err := kafkabroker.NewSource(ctx, cfg, topic)
			if err != nil {
				return nil, nil, err
			}
			return s, s.Close, nil
		},
	}
}

// TestHelperProcess is not a test: it is a relay or consumer process of
// TestKillsRelayAndConsumers, killed by it.
func TestHelperProcess(t *testing.T) {
	if brokerkill.Role() == "" {
		t.Skip("helper process only")
	}
	b := kafkaBroker(strings.Split(os.Getenv(brokersEnv), ","), os.Getenv(topicEnv))
	if err := brokerkill.Helper(context.Background(), b); err != nil {
		t.Fatal(err)
	}
}

// outbox → relay → Kafka → inbox with relay and consumer processes
// SIGKILLed at random moments and a consumer joining and leaving the group
// mid-batch: every event is applied once, in its key's order, the topic's
// eight partitions keyed by Oncekit-Key. The cluster lives in this process
// and survives the kills.
func TestKillsRelayAndConsumers(t *testing.T) {
	t.Parallel()
	_, brokers := kafkatest.New(t)
	topic := kafkatest.Topic(t, brokers, 8)
	db := testenv.NewDB(t)
	b := kafkaBroker(brokers, topic)
	b.Stored = func(context.Context) (int, error) { return kafkatest.Stored(brokers, topic) }
	sum, err := brokerkill.Run(context.Background(), brokerkill.Config{
		Broker: b,
		Pool:   db.Pool, URL: db.URL, Schema: db.Schema,
		Command: func() *exec.Cmd {
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
			cmd.Env = append(os.Environ(), brokersEnv+"="+strings.Join(brokers, ","), topicEnv+"="+topic)
			return cmd
		},
		LogDir: t.TempDir(),
	})
	t.Log(sum)
	require.NoError(t, err)
	require.NoError(t, sum.Failed())
	require.Positive(t, sum.RelayKills)
	require.Positive(t, sum.ConsumerKills)
	require.Positive(t, sum.Joins)
	require.Positive(t, sum.Leaves)
	require.GreaterOrEqual(t, sum.Stored, sum.Events, "every event reached the topic")
}
