// Command demo shows oncekit's producer half end to end: it writes an order's
// events into the outbox in one transaction, runs the relay, and prints the
// events as they arrive in JetStream.
//
// It uses DATABASE_URL (default postgres://postgres@127.0.0.1:5432/postgres)
// and NATS_URL (default nats://127.0.0.1:4222); when no NATS server answers it
// starts an embedded one.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/migrations"
	"github.com/oncekit/oncekit/oncekittest"
	"github.com/oncekit/oncekit/outbox"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	schema := getenv("ONCEKIT_SCHEMA", "oncekit")
	pool, err := pgxpool.New(ctx, getenv("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"))
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := migrations.Up(ctx, pool, migrations.WithSchema(schema)); err != nil {
		return fmt.Errorf("migrate (is PostgreSQL up?): %w", err)
	}

	nc, stopNATS, err := oncekittest.Connect(getenv("NATS_URL", nats.DefaultURL))
	if err != nil {
		return err
	}
	defer stopNATS()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	stream, err := natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{Name: "ONCEKIT_DEMO", Subjects: []string{"demo.>"}})
	if err != nil {
		return err
	}
	// Watch for new events before writing any.
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		return err
	}

	// 1. The business change and its events commit together.
	ob, err := outbox.New(&outbox.Config{Schema: schema})
	if err != nil {
		return err
	}
	order := "order-" + randomHex()
	var events []broker.Message
	for _, kind := range []string{"created", "paid", "shipped"} {
		events = append(events, broker.Message{
			ID:      oncekit.DeriveID(order, kind), // replaying the operation yields the same IDs
			Subject: "demo.orders." + kind,
			Key:     order, // per-key order
			Payload: fmt.Appendf(nil, `{"order":%q,"event":%q}`, order, kind),
		})
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		res, err := ob.Enqueue(ctx, tx, events...)
		fmt.Printf("enqueued %d events for %s in one transaction\n", res.Inserted, order)
		return err
	})
	if err != nil {
		return err
	}

	// 2. The relay publishes them (normally the `oncekit relay` daemon).
	pub, err := natsjs.NewPublisher(nc, nil)
	if err != nil {
		return err
	}
	relay, err := outbox.NewRelay(pool, pub, &outbox.RelayConfig{
		Schema: schema,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	rctx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(rctx) }()

	// 3. They arrive once each, in order.
	for seen := 0; seen < len(events); {
		batch, err := cons.Fetch(len(events)-seen, jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			return err
		}
		for m := range batch.Messages() {
			if m.Headers().Get(broker.HeaderKey) != order {
				continue // another run's event
			}
			meta, _ := m.Metadata()
			fmt.Printf("received %-20s id=%s seq=%d %s\n", m.Subject(), m.Headers().Get(broker.HeaderMsgID), meta.Sequence.Stream, m.Data())
			seen++
		}
		if err := batch.Error(); err != nil {
			return err
		}
	}
	stopRelay()
	if err := <-relayDone; err != nil {
		return err
	}
	fmt.Println("done: each event published exactly once, in order")
	return nil
}

func getenv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func randomHex() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
