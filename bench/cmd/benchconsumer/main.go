// Command benchconsumer runs one inbox.Consumer as a process of its own, for
// BenchmarkScaleMemory: it consumes a JetStream durable into PostgreSQL with
// the batch consumer (claims on, BatchSize 200, 4 workers), each handler
// inserting one row into bench_effects, until SIGTERM or SIGINT.
//
// Usage:
//
//	benchconsumer -database-url URL -schema NAME -nats-url URL -stream NAME
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/inbox"
)

// config is what the command line sets.
type config struct {
	dbURL, schema, natsURL, stream string
}

func main() {
	var cfg config
	flag.StringVar(&cfg.dbURL, "database-url", "", "PostgreSQL URL")
	flag.StringVar(&cfg.schema, "schema", "oncekit", "schema of oncekit's tables (bench_effects lives there too)")
	flag.StringVar(&cfg.natsURL, "nats-url", nats.DefaultURL, "NATS URL")
	flag.StringVar(&cfg.stream, "stream", "", "JetStream stream to consume")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "benchconsumer:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config) error {
	pool, err := pgxpool.New(ctx, cfg.dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	nc, err := nats.Connect(cfg.natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	src, err := natsjs.NewSource(ctx, js, &natsjs.SourceConfig{Stream: cfg.stream, Durable: "benchconsumer"})
	if err != nil {
		return err
	}
	defer src.Close()
	insert := fmt.Sprintf(`INSERT INTO %s.bench_effects (message_id, payload) VALUES ($1, $2)`, pgx.Identifier{cfg.schema}.Sanitize())
	c, err := inbox.NewConsumer(pool, src, inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		_, err := tx.Exec(ctx, insert, msg.ID, msg.Payload)
		return err
	}), &inbox.Config{Name: "bench", Schema: cfg.schema, BatchSize: 200, Concurrency: 4, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return err
	}
	return c.Run(ctx)
}
