// Package brokerbench holds what the throughput benchmarks of the other
// brokers (Kafka, SQS) share: their events, the relay's drain of an outbox
// into a broker and the business table a consumer applies events to. Each
// broker's benchmark keeps its peer (the broker's own client) and what
// only it knows (topics, queues, group joins).
package brokerbench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/outbox"
)

// Logger shows the relay's warnings only: a drain far slower than usual
// says why (publishes failed and were tried again).
var Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// N is the number of events each run moves: the environment variable env
// when it holds a positive number, else 5,000.
func N(env string) int {
	if n, err := strconv.Atoi(os.Getenv(env)); err == nil && n > 0 {
		return n
	}
	return 5000
}

// Events are n events of 256-byte payloads over 64 keys, on subject.
func Events(subject string, n int) []broker.Message {
	payload := make([]byte, 256)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	msgs := make([]broker.Message, n)
	for i := range msgs {
		msgs[i] = broker.Message{ID: uuid.New(), Subject: subject, Key: fmt.Sprintf("k-%d", i%64), Payload: payload}
	}
	return msgs
}

// RelayDrain enqueues msgs into the outbox of schema (untimed), then runs
// a relay publishing to pub with b's timer running and returns its msgs/s
// from its start until every row is marked published. The caller checks
// that the broker holds them.
func RelayDrain(b *testing.B, pool *pgxpool.Pool, schema string, pub broker.Publisher, msgs []broker.Message) float64 {
	b.Helper()
	b.StopTimer()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ob, err := outbox.New(&outbox.Config{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	n := len(msgs)
	for i := 0; i < n; i += 1000 {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := ob.Enqueue(ctx, tx, msgs[i:min(i+1000, n)]...)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `ANALYZE`); err != nil {
		b.Fatal(err)
	}
	relay, err := outbox.NewRelay(pool, ob, pub, &outbox.RelayConfig{Logger: Logger, Retention: -1})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	b.StartTimer()
	start := time.Now()
	go func() { done <- relay.Run(ctx) }()
	for {
		left, err := ob.Backlog(ctx, pool)
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
	return float64(n) / elapsed.Seconds()
}

// Effects is a business table of schema that consumers apply events to, a
// row per event ID.
type Effects struct {
	pool  *pgxpool.Pool
	table string
}

// NewEffects creates the empty table effects in schema.
func NewEffects(b *testing.B, pool *pgxpool.Pool, schema string) *Effects {
	b.Helper()
	e := &Effects{pool: pool, table: pgx.Identifier{schema, "effects"}.Sanitize()}
	if _, err := pool.Exec(context.Background(), `CREATE TABLE `+e.table+` (event_id uuid PRIMARY KEY, body bytea NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	return e
}

// Handler applies an event in the inbox's transaction: a plain INSERT.
func (e *Effects) Handler() inbox.Handler {
	return inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+e.table+` (event_id, body) VALUES ($1, $2)`, msg.ID, msg.Payload)
		return err
	})
}

// Apply applies an event outside the inbox, as a peer's loop does: a plain
// INSERT that a redelivered copy does not fail.
func (e *Effects) Apply(ctx context.Context, id string, body []byte) error {
	_, err := e.pool.Exec(ctx, `INSERT INTO `+e.table+` (event_id, body) VALUES ($1, $2) ON CONFLICT DO NOTHING`, id, body)
	return err
}

// Count is the number of events applied.
func (e *Effects) Count(ctx context.Context) (int, error) {
	var n int
	err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.table).Scan(&n)
	return n, err
}

// WaitFor waits until want events are applied, polling the table every
// 5 ms (part of a measurement that runs meanwhile), for up to 5 minutes.
func (e *Effects) WaitFor(b *testing.B, want int) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for {
		got, err := e.Count(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if got >= want {
			return
		}
		time.Sleep(5 * time.Millisecond) // polling the table, part of the measurement
	}
}
