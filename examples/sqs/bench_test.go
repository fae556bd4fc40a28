package main

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/examples/sqs/fauxqs"
	"github.com/oncekit/oncekit/examples/sqs/sqsbroker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/brokerbench"
	"github.com/oncekit/oncekit/oncekittest"
)

// quiet discards the relay's and the consumer's logs.
var quiet = slog.New(slog.DiscardHandler)

// benchN is the number of events each run moves: ONCEKIT_SQS_BENCH_N,
// default 5,000.
func benchN() int { return brokerbench.N("ONCEKIT_SQS_BENCH_N") }

// peerWorkers is the number of the bare SDK's send or receive loops: the
// inbox consumer's default Concurrency.
const peerWorkers = 4

// BenchmarkSQSRelay drains N outbox rows into a standard queue of fauxqs
// with oncekit's relay (through sqsbroker), and reports its msgs/s with
// x-sdk: its rate over that of the bare AWS SDK sending the same N
// messages to another queue (SendMessageBatch, 10 entries a call, from
// peerWorkers loops), run just before it in the same iteration. One
// iteration is one drain of each (use -benchtime 1x).
func BenchmarkSQSRelay(b *testing.B) {
	client := fauxqs.Shared(b).Client()
	n := benchN()
	for range b.N {
		b.StopTimer()
		peer := peerSend(b, client, n)
		b.StartTimer()
		rate := relayDrain(b, client, n)
		b.ReportMetric(rate, "msgs/s")
		b.ReportMetric(peer, "sdk-msgs/s")
		b.ReportMetric(rate/peer, "x-sdk")
	}
}

// BenchmarkSQSConsume consumes N messages already in a standard queue into
// PostgreSQL, one business row each: oncekit's inbox consumer (BatchSize
// 200, its default Concurrency) on an sqsbroker source, against the bare
// SDK (peerWorkers loops of ReceiveMessage for 10, a plain INSERT per
// message, DeleteMessageBatch), run just before it in the same iteration.
// Reports msgs/s, the peer's and x-sdk. One iteration is one run of each.
func BenchmarkSQSConsume(b *testing.B) {
	client := fauxqs.Shared(b).Client()
	n := benchN()
	for range b.N {
		b.StopTimer()
		peer := peerReceive(b, client, n)
		b.StartTimer()
		rate := inboxConsume(b, client, n)
		b.ReportMetric(rate, "msgs/s")
		b.ReportMetric(peer, "sdk-msgs/s")
		b.ReportMetric(rate/peer, "x-sdk")
	}
}

// relayDrain returns the relay's msgs/s draining n events from a fresh
// outbox into a fresh queue.
func relayDrain(b *testing.B, client *sqs.Client, n int) float64 {
	b.Helper()
	b.StopTimer()
	db := oncekittest.NewDB(b)
	queue := fauxqs.NewQueue(b, client, false, nil)
	pub, err := sqsbroker.NewPublisher(client, sqsbroker.PublisherConfig{QueueURL: func(string) string { return queue }})
	if err != nil {
		b.Fatal(err)
	}
	return brokerbench.RelayDrain(b, db.Pool, db.Schema, pub, brokerbench.Events("bench", n))
}

// sendAll sends msgs to queue with the bare SDK, 10 entries a call from
// peerWorkers loops, each message's body its payload and its event ID an
// attribute.
func sendAll(ctx context.Context, client *sqs.Client, queue string, msgs []broker.Message) error {
	work := make(chan []broker.Message)
	errs := make(chan error, peerWorkers)
	var wg sync.WaitGroup
	for range peerWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for batch := range work {
				entries := make([]types.SendMessageBatchRequestEntry, len(batch))
				for i, m := range batch {
					entries[i] = types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(string(m.Payload)),
						MessageAttributes: map[string]types.MessageAttributeValue{
							sqsbroker.AttrEventID: {DataType: aws.String("String"), StringValue: aws.String(m.ID.String())},
						}}
				}
				out, err := client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(queue), Entries: entries})
				if err == nil && len(out.Failed) > 0 {
					err = fmt.Errorf("%d of a batch failed: %s", len(out.Failed), aws.ToString(out.Failed[0].Message))
				}
				if err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := 0; i < len(msgs); i += 10 {
		work <- msgs[i:min(i+10, len(msgs))]
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// peerSend returns the msgs/s of the bare SDK sending n events to a fresh
// queue.
func peerSend(b *testing.B, client *sqs.Client, n int) float64 {
	b.Helper()
	queue := fauxqs.NewQueue(b, client, false, nil)
	msgs := brokerbench.Events("bench", n)
	start := time.Now()
	if err := sendAll(context.Background(), client, queue, msgs); err != nil {
		b.Fatal(err)
	}
	return float64(n) / time.Since(start).Seconds()
}

// consumeWorld is a queue holding n events and a schema with an empty
// effects table.
type consumeWorld struct {
	db      *oncekittest.DB
	queue   string
	effects *brokerbench.Effects
}

// newConsumeWorld fills a fresh queue with n events as sqsbroker sends
// them (the bare SDK's loop reads only their body and event ID).
func newConsumeWorld(b *testing.B, client *sqs.Client, n int) *consumeWorld {
	b.Helper()
	ctx := context.Background()
	w := &consumeWorld{db: oncekittest.NewDB(b), queue: fauxqs.NewQueue(b, client, false, nil)}
	w.effects = brokerbench.NewEffects(b, w.db.Pool, w.db.Schema)
	pub, err := sqsbroker.NewPublisher(client, sqsbroker.PublisherConfig{QueueURL: func(string) string { return w.queue }})
	if err != nil {
		b.Fatal(err)
	}
	msgs := brokerbench.Events("bench", n)
	for i := 0; i < n; i += 1000 {
		for _, r := range pub.Publish(ctx, msgs[i:min(i+1000, n)]) {
			if r.Err != nil {
				b.Fatal(r.Err)
			}
		}
	}
	return w
}

// inboxConsume returns the msgs/s of oncekit's batch consumer applying n
// events, from its start until the effects table holds n rows.
func inboxConsume(b *testing.B, client *sqs.Client, n int) float64 {
	b.Helper()
	b.StopTimer()
	w := newConsumeWorld(b, client, n)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src, err := sqsbroker.NewSource(client, sqsbroker.SourceConfig{QueueURL: w.queue, Subject: "bench", WaitTime: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	c, err := inbox.NewConsumer(w.db.Pool, src, w.effects.Handler(), &inbox.Config{Name: "bench", Schema: w.db.Schema, BatchSize: 200, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	b.StartTimer()
	start := time.Now()
	go func() { done <- c.Run(ctx) }()
	w.effects.WaitFor(b, n)
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	<-done
	return float64(n) / elapsed.Seconds()
}

// peerReceive returns the msgs/s of the bare SDK applying n events:
// peerWorkers loops of ReceiveMessage (up to 10), a plain INSERT per
// message, then DeleteMessageBatch, from their start until the effects
// table holds n rows.
func peerReceive(b *testing.B, client *sqs.Client, n int) float64 {
	b.Helper()
	w := newConsumeWorld(b, client, n)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	var failed atomic.Int64
	start := time.Now()
	for range peerWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				out, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(w.queue),
					MaxNumberOfMessages: 10, WaitTimeSeconds: 1, VisibilityTimeout: 30, MessageAttributeNames: []string{"All"}})
				if err != nil {
					if ctx.Err() == nil && failed.Add(1) == 1 {
						b.Logf("ReceiveMessage: %v", err) // tried again; what it held is visible again after 30 s
					}
					continue
				}
				var del []types.DeleteMessageBatchRequestEntry
				for i, m := range out.Messages {
					id := aws.ToString(m.MessageAttributes[sqsbroker.AttrEventID].StringValue)
					if err := w.effects.Apply(ctx, id, []byte(aws.ToString(m.Body))); err != nil {
						continue // visible again after the timeout
					}
					del = append(del, types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle})
				}
				if len(del) > 0 {
					_, _ = client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(w.queue), Entries: del})
				}
			}
		}()
	}
	w.effects.WaitFor(b, n)
	rate := float64(n) / time.Since(start).Seconds()
	b.ReportMetric(float64(failed.Load()), "sdk-receive-errors")
	return rate
}
