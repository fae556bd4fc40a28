package main

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/google/uuid"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/examples/kafka/kafkabroker"
	"github.com/oncekit/oncekit/examples/kafka/kafkatest"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/brokerbench"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/watermill/asbroker"
)

// benchN is the number of events each run moves: ONCEKIT_KAFKA_BENCH_N,
// default 5,000.
func benchN() int { return brokerbench.N("ONCEKIT_KAFKA_BENCH_N") }

// benchPartitions is the partitions of every benchmark topic.
const benchPartitions = 4

// BenchmarkKafkaRelay drains N outbox rows into a topic of a three-broker
// kfake cluster with oncekit's relay (through kafkabroker), and reports
// its msgs/s with x-watermill: its rate over that of watermill-kafka's own
// publisher sending the same N messages straight to another topic (the
// same sarama settings and 16 publishes in flight, as kafkabroker's
// publisher has), run just before it in the same iteration. One iteration
// is one drain of each (use -benchtime 1x).
func BenchmarkKafkaRelay(b *testing.B) {
	_, brokers := kafkatest.New(b)
	n := benchN()
	for range b.N {
		b.StopTimer()
		peer := peerPublish(b, brokers, n)
		b.StartTimer()
		rate := relayDrain(b, brokers, n)
		b.ReportMetric(rate, "msgs/s")
		b.ReportMetric(peer, "watermill-msgs/s")
		b.ReportMetric(rate/peer, "x-watermill")
	}
}

// BenchmarkKafkaConsume consumes N messages already in a topic into
// PostgreSQL, one business row each: oncekit's inbox consumer in batches
// of 200 on a kafkabroker source, against watermill-kafka's own subscriber
// in the same consumer-group settings with a plain INSERT and an ack per
// message, each message handled in a goroutine of its own as watermill's
// router does, run just before it in the same iteration. Each is timed from
// its first applied event (the consumer group's join before it is sarama's
// on both sides). Reports msgs/s, the peer's and x-watermill. One
// iteration is one run of each.
func BenchmarkKafkaConsume(b *testing.B) {
	_, brokers := kafkatest.New(b)
	n := benchN()
	for range b.N {
		b.StopTimer()
		// Each times itself from its first applied event.
		peer := peerConsume(b, brokers, n)
		rate := inboxConsume(b, brokers, n)
		b.StartTimer()
		b.ReportMetric(rate, "msgs/s")
		b.ReportMetric(peer, "watermill-msgs/s")
		b.ReportMetric(rate/peer, "x-watermill")
	}
}

// benchTopic creates a topic of its own, benchPartitions partitions
// replicated on every broker.
func benchTopic(b *testing.B, brokers []string) string {
	b.Helper()
	name := "bench-" + uuid.NewString()
	if err := kafkatest.CreateTopic(brokers, name, benchPartitions); err != nil {
		b.Fatal(err)
	}
	return name
}

// relayDrain returns the relay's msgs/s draining n events from a fresh
// outbox into a fresh topic, which must then hold them all.
func relayDrain(b *testing.B, brokers []string, n int) float64 {
	b.Helper()
	b.StopTimer()
	db := testenv.NewDB(b)
	topic := benchTopic(b, brokers)
	pub, err := kafkabroker.NewPublisher(kafkabroker.Config{Brokers: brokers})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	rate := brokerbench.RelayDrain(b, db.Pool, db.Schema, pub, brokerbench.Events(topic, n))
	if got, err := kafkatest.Stored(brokers, topic); err != nil || got < n {
		b.Fatalf("the topic holds %d of %d messages (%v)", got, n, err)
	}
	return rate
}

// peerPublish returns the msgs/s of watermill-kafka's publisher sending n
// events to a fresh topic, 16 at a time.
func peerPublish(b *testing.B, brokers []string, n int) float64 {
	b.Helper()
	topic := benchTopic(b, brokers)
	wpub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers, Marshaler: kafkabroker.Marshaler(),
		OverwriteSaramaConfig: kafkabroker.PublisherSarama(kafkabroker.Config{Brokers: brokers})}, watermill.NopLogger{})
	if err != nil {
		b.Fatal(err)
	}
	defer wpub.Close()
	msgs := brokerbench.Events(topic, n)
	ctx := context.Background()
	work := make(chan broker.Message)
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	start := time.Now()
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range work {
				if err := wpub.Publish(topic, asbroker.Message(ctx, m)); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for _, m := range msgs {
		work <- m
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(start)
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	return float64(n) / elapsed.Seconds()
}

// consumeWorld is a topic holding n events and a schema with an empty
// effects table.
type consumeWorld struct {
	db      *testenv.DB
	topic   string
	effects *brokerbench.Effects
}

func newConsumeWorld(b *testing.B, brokers []string, n int) *consumeWorld {
	b.Helper()
	ctx := context.Background()
	w := &consumeWorld{db: testenv.NewDB(b), topic: benchTopic(b, brokers)}
	w.effects = brokerbench.NewEffects(b, w.db.Pool, w.db.Schema)
	pub, err := kafkabroker.NewPublisher(kafkabroker.Config{Brokers: brokers})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	msgs := brokerbench.Events(w.topic, n)
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
// events, from its first applied event until the effects table holds n
// rows.
func inboxConsume(b *testing.B, brokers []string, n int) float64 {
	b.Helper()
	b.StopTimer()
	w := newConsumeWorld(b, brokers, n)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src, err := kafkabroker.NewSource(ctx, kafkabroker.Config{Brokers: brokers, Group: "bench-" + uuid.NewString()[:8]}, w.topic)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	c, err := inbox.NewConsumer(w.db.Pool, src, w.effects.Handler(), &inbox.Config{Name: "bench", Schema: w.db.Schema, BatchSize: 200, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	elapsed := timeApplied(b, w, n)
	cancel()
	<-done
	return float64(n-1) / elapsed.Seconds()
}

// timeApplied waits for the first effect, then times the rest until w's
// effects table holds n rows, with b's timer running: the consumer group's
// join before the first (sarama's, the same for both contenders, seconds on
// kfake) is left out.
func timeApplied(b *testing.B, w *consumeWorld, n int) time.Duration {
	b.Helper()
	w.effects.WaitFor(b, 1)
	b.StartTimer()
	start := time.Now()
	w.effects.WaitFor(b, n)
	elapsed := time.Since(start)
	b.StopTimer()
	return elapsed
}

// peerConsume returns the msgs/s of watermill-kafka's subscriber applying
// n events with a plain INSERT and an ack each, from its first applied
// event until the effects table holds n rows.
func peerConsume(b *testing.B, brokers []string, n int) float64 {
	b.Helper()
	w := newConsumeWorld(b, brokers, n)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kcfg := kafkabroker.Config{Brokers: brokers, SessionTimeout: 10 * time.Second}
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: brokers, Unmarshaler: kafkabroker.Marshaler(), ConsumerGroup: "bench-" + uuid.NewString()[:8],
		OverwriteSaramaConfig: kafkabroker.SubscriberSarama(kcfg), NackResendSleep: kafka.NoSleep,
	}, watermill.NopLogger{})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	in, err := sub.Subscribe(ctx, w.topic)
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		for m := range in {
			go func() {
				if err := w.effects.Apply(ctx, m.UUID, []byte(m.Payload)); err != nil {
					m.Nack()
					return
				}
				m.Ack()
			}()
		}
	}()
	return float64(n-1) / timeApplied(b, w, n).Seconds()
}
