// Command kafka wires oncekit to Kafka through watermill-kafka: the relay
// publishes the outbox to a topic, and an inbox consumer in a Kafka
// consumer group processes it, each event once.
//
// It lives in a module of its own so that watermill-kafka and its Kafka
// client (IBM/sarama) stay out of oncekit's go.mod.
//
// Kafka does not dedup by oncekit's event ID (its idempotent producer only
// drops retries of one producer session), so a message the relay publishes
// twice (it died between publish and mark) is stored twice, and the inbox's
// claim on the event ID is what dedups it. A partition keeps order, so the
// messages are keyed by the Oncekit-Key header (kafkabroker's marshaler):
// a key's messages stay in one partition, in order.
//
// Without -brokers it starts a three-broker Kafka cluster in the process
// (franz-go's kfake) and creates the topic; with -brokers the topic must
// exist. It (re)creates its schema, enqueues -events invoices events over
// five customers, runs the relay and the consumer until each is applied,
// and prints an account:
//
//	go run .                                   # kfake in-process
//	go run . -brokers 127.0.0.1:9092 -topic payments
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/examples/kafka/kafkabroker"
	"github.com/oncekit/oncekit/examples/kafka/kafkatest"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/migrations"
	"github.com/oncekit/oncekit/outbox"
)

// config is the example's flags.
type config struct {
	Brokers []string // empty: kfake in the process
	Topic   string
	DBURL   string
	Schema  string
	Events  int
	Logger  *slog.Logger // nil: slog's default
}

func main() {
	var cfg config
	brokers := flag.String("brokers", "", "Kafka brokers, comma-separated (empty: a three-broker kfake cluster in this process)")
	flag.StringVar(&cfg.Topic, "topic", "payments", "Kafka topic")
	flag.StringVar(&cfg.DBURL, "database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL")
	flag.StringVar(&cfg.Schema, "schema", "kafka_demo", "schema of the example's tables, dropped and created again")
	flag.IntVar(&cfg.Events, "events", 500, "events to enqueue")
	flag.Parse()
	if *brokers != "" {
		cfg.Brokers = strings.Split(*brokers, ",")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, cfg config, out io.Writer) error {
	start := time.Now()
	if len(cfg.Brokers) == 0 {
		c, err := kafkatest.Start()
		if err != nil {
			return err
		}
		defer c.Close()
		cfg.Brokers = c.ListenAddrs()
		if err := kafkatest.CreateTopic(cfg.Brokers, cfg.Topic, 4); err != nil {
			return err
		}
		fmt.Fprintf(out, "kfake: %d brokers at %s, topic %s with 4 partitions\n", kafkatest.Brokers, strings.Join(cfg.Brokers, ","), cfg.Topic)
	}
	pool, err := pgxpool.New(ctx, cfg.DBURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := setUp(ctx, pool, cfg.Schema); err != nil {
		return err
	}

	kcfg := kafkabroker.Config{Brokers: cfg.Brokers, Group: "billing"}
	pub, err := kafkabroker.NewPublisher(kcfg)
	if err != nil {
		return err
	}
	defer pub.Close()
	ob, err := outbox.New(&outbox.Config{Schema: cfg.Schema})
	if err != nil {
		return err
	}
	relay, err := outbox.NewRelay(pool, ob, pub, &outbox.RelayConfig{PollInterval: 50 * time.Millisecond, Logger: cfg.Logger})
	if err != nil {
		return err
	}
	src, err := kafkabroker.NewSource(ctx, kcfg, cfg.Topic)
	if err != nil {
		return err
	}
	defer src.Close()
	invoices := pgx.Identifier{cfg.Schema, "invoices"}.Sanitize()
	c, err := inbox.NewConsumer(pool, src, inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+invoices+` (event_id, customer, body) VALUES ($1, $2, $3)`, msg.ID, msg.Key, msg.Payload)
		return err
	}), &inbox.Config{Name: "billing", Schema: cfg.Schema, Logger: cfg.Logger})
	if err != nil {
		return err
	}

	// The business write and its event, in one transaction.
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	msgs := make([]broker.Message, cfg.Events)
	for i := range msgs {
		msgs[i] = broker.Message{ID: uuid.New(), Subject: cfg.Topic, Key: fmt.Sprintf("customer-%d", i%5),
			Payload: fmt.Appendf(nil, `{"invoice":%d}`, i)}
	}
	if _, err := ob.Enqueue(ctx, tx, msgs...); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	fmt.Fprintf(out, "enqueued %d events over 5 customers\n", cfg.Events)

	// The relay and the consumer run until every event is applied; if one
	// of them fails, the other stops too.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(rctx)
	g.Go(func() error { return relay.Run(gctx) })
	g.Go(func() error { return c.Run(gctx) })
	g.Go(func() error { defer cancel(); return waitApplied(gctx, pool, invoices, cfg.Events) })
	if err := g.Wait(); err != nil && ctx.Err() == nil && rctx.Err() == nil {
		return err
	}
	var total, distinct int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id) FROM `+invoices).Scan(&total, &distinct); err != nil {
		return err
	}
	s := c.Stats()
	fmt.Fprintf(out, "applied %d invoices (%d distinct events) in %s; consumer: %d processed, %d duplicates\n",
		total, distinct, time.Since(start).Round(time.Millisecond), s.Processed, s.Duplicates)
	if total != cfg.Events || distinct != cfg.Events {
		return fmt.Errorf("kafka example: %d invoices, %d distinct, for %d events", total, distinct, cfg.Events)
	}
	return nil
}

// setUp drops the example's schema, then creates oncekit's tables and the
// invoices table in it.
func setUp(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	s := pgx.Identifier{schema}.Sanitize()
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+s+` CASCADE`); err != nil {
		return err
	}
	if _, err := migrations.Up(ctx, pool, migrations.WithSchema(schema)); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `CREATE TABLE `+s+`.invoices (event_id uuid PRIMARY KEY, customer text NOT NULL, body bytea NOT NULL)`)
	return err
}

// waitApplied returns once table holds n rows.
func waitApplied(ctx context.Context, pool *pgxpool.Pool, table string, n int) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		var got int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&got); err != nil {
			return err
		}
		if got >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
