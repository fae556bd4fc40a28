package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/examples/kafka/kafkabroker"
	"github.com/oncekit/oncekit/examples/kafka/kafkatest"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/watermill/asbroker"
)

// benchLogger shows the relay's warnings only: a drain far slower than
// usual says why (publishes failed and were tried again).
var benchLogger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// benchN is the number of events each run moves: ONCEKIT_KAFKA_BENCH_N,
// default 5,000.
func benchN() int {
	if n, err := strconv.Atoi(os.Getenv("ONCEKIT_KAFKA_BENCH_N")); err == nil && n > 0 {
		return n
	}
	return 5000
}

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

// benchEvents are n events of 256-byte payloads over 64 keys.
func benchEvents(topic string, n int) []broker.Message {
	payload := make([]byte, 256)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	msgs := make([]broker.Message, n)
	for i := range msgs {
		msgs[i] = broker.Message{ID: uuid.New(), Subject: topic, Key: fmt.Sprintf("k-%d", i%64), Payload: payload}
	}
	return msgs
}

// relayDrain fills a fresh outbox with n events (untimed) and returns the
// relay's msgs/s from its start until every row is marked published.
func relayDrain(b *testing.B, brokers []string, n int) float64 {
	b.Helper()
	b.StopTimer()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db := testenv.NewDB(b)
	topic := benchTopic(b, brokers)
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
	if err != nil {
		b.Fatal(err)
	}
	msgs := benchEvents(topic, n)
	for i := 0; i < n; i += 1000 {
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := ob.Enqueue(ctx, tx, msgs[i:min(i+1000, n)]...)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	if _, err := db.Pool.Exec(ctx, `ANALYZE`); err != nil {
		b.Fatal(err)
	}
	pub, err := kafkabroker.NewPublisher(kafkabroker.Config{Brokers: brokers})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	relay, err := outbox.NewRelay(db.Pool, ob, pub, &outbox.RelayConfig{Logger: benchLogger, Retention: -1})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	b.StartTimer()
	start := time.Now()
	go func() { done <- relay.Run(ctx) }()
	for {
		left, err := ob.Backlog(ctx, db.Pool)
		if err != nil {
			b.Fatal(err)
		}
		if left.Pending == 0 {
			break
		}
		time.Sleep(2 * time.Millisecond) // polling the backlog, inside the measurement
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	if got, err := kafkatest.Stored(brokers, topic); err != nil || got < n {
		b.Fatalf("the topic holds %d of %d messages (%v)", got, n, err)
	}
	return float64(n) / elapsed.Seconds()
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
	msgs := benchEvents(topic, n)
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
	effects string
}

func newConsumeWorld(b *testing.B, brokers []string, n int) *consumeWorld {
	b.Helper()
	ctx := context.Background()
	w := &consumeWorld{db: testenv.NewDB(b), topic: benchTopic(b, brokers)}
	w.effects = pgx.Identifier{w.db.Schema, "effects"}.Sanitize()
	if _, err := w.db.Pool.Exec(ctx, `CREATE TABLE `+w.effects+` (event_id uuid PRIMARY KEY, body bytea NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	pub, err := kafkabroker.NewPublisher(kafkabroker.Config{Brokers: brokers})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	msgs := benchEvents(w.topic, n)
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
	c, err := inbox.NewConsumer(w.db.Pool, src, inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+w.effects+` (event_id, body) VALUES ($1, $2)`, msg.ID, msg.Payload)
		return err
	}), &inbox.Config{Name: "bench", Schema: w.db.Schema, BatchSize: 200, Logger: quiet})
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	count := func() int {
		var got int
		if err := w.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+w.effects).Scan(&got); err != nil {
			b.Fatal(err)
		}
		return got
	}
	poll := func(want int) {
		for count() < want {
			time.Sleep(5 * time.Millisecond) // polling the table, part of the measurement
		}
	}
	poll(1)
	b.StartTimer()
	start := time.Now()
	poll(n)
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
				_, err := w.db.Pool.Exec(ctx, `INSERT INTO `+w.effects+` (event_id, body) VALUES ($1, $2) ON CONFLICT DO NOTHING`, m.UUID, []byte(m.Payload))
				if err != nil {
					m.Nack()
					return
				}
				m.Ack()
			}()
		}
	}()
	return float64(n-1) / timeApplied(b, w, n).Seconds()
}
