package outbox_test

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/outbox"
)

// Write a business row and its event in one transaction.
func ExampleOutbox_Enqueue() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/postgres")
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	ob, err := outbox.New(&outbox.Config{Schema: "oncekit"})
	if err != nil {
		panic(err)
	}
	paymentID := "pay_123"
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO payments (id, amount) VALUES ($1, 100)`, paymentID); err != nil {
			return err
		}
		res, err := ob.Enqueue(ctx, tx, broker.Message{
			ID:      oncekit.DeriveID(paymentID, "PaymentCreated"),
			Subject: "payments.created",
			Key:     paymentID,
			Payload: []byte(`{"id":"pay_123","amount":100}`),
		})
		if err != nil {
			return err
		}
		fmt.Println("inserted", res.Inserted, "duplicates", len(res.Duplicates))
		return nil
	})
	if err != nil {
		panic(err)
	}
}

// Run the relay in-process (the `oncekit relay` daemon does the same).
func ExampleNewRelay() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/postgres?pool_max_conns=20")
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	nc, err := nats.Connect(nats.DefaultURL, nats.MaxReconnects(-1))
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	pub, err := natsjs.NewPublisher(nc, nil)
	if err != nil {
		panic(err)
	}
	ob, err := outbox.New(&outbox.Config{Schema: "oncekit"}) // the writers' outbox: the relay takes its schema
	if err != nil {
		panic(err)
	}
	relay, err := outbox.NewRelay(pool, ob, pub, &outbox.RelayConfig{Registerer: prometheus.DefaultRegisterer})
	if err != nil {
		panic(err)
	}
	if err := relay.Run(ctx); err != nil { // until interrupted
		panic(err)
	}
}

// Follow the WAL instead of polling the table (wal_level = logical): the
// producers enqueue with the same Config, and the relay's first run creates
// the slot they need (or SetUpLogical does, ahead of them).
func ExampleNewLogicalRelay() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	const url = "postgres://oncekit_relay@127.0.0.1:5432/app" // a role with REPLICATION
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	nc, err := nats.Connect(nats.DefaultURL, nats.MaxReconnects(-1))
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	pub, err := natsjs.NewPublisher(nc, nil)
	if err != nil {
		panic(err)
	}
	ob, err := outbox.New(&outbox.Config{Schema: "oncekit", Logical: true})
	if err != nil {
		panic(err)
	}
	// The replication stream and the lease use the pool's connection
	// settings; a pool through a pooler needs ReplicationURL (the server's).
	relay, err := outbox.NewLogicalRelay(pool, ob, pub, &outbox.LogicalRelayConfig{Registerer: prometheus.DefaultRegisterer})
	if err != nil {
		panic(err)
	}
	if err := relay.Run(ctx); err != nil { // until interrupted; a second relay stands by
		panic(err)
	}
}
