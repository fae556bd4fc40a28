// Command sqs wires oncekit to Amazon SQS through the sketch adapter in
// sqsbroker: the relay publishes the outbox to a queue, and an inbox
// consumer processes it, each event once. See sqsbroker's documentation for
// what dedup rests on (FIFO queues: SQS's 5-minute deduplication by event
// ID, then the inbox claim; standard queues: the inbox claim alone).
//
// It lives in a module of its own so that the AWS SDK stays out of
// oncekit's go.mod. Its tests run it against fauxqs, an SQS emulator
// (main_test.go), and run sqsbroker's publisher and source there with relay
// and consumer processes SIGKILLed at random moments (kill_test.go).
// The SDK's usual settings apply (AWS_REGION, credentials,
// AWS_ENDPOINT_URL for an emulator).
//
//	go run . -queue-url https://sqs.eu-west-1.amazonaws.com/123456789012/payments.fifo -fifo
//	go run . -role relay ...    # and -role consumer, as separate processes
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/examples/sqs/sqsbroker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/outbox"
)

// options are what the command line sets.
type options struct {
	queueURL string // every outbox subject goes to it
	subject  string // the outbox subject the consumer reads
	fifo     bool
	dbURL    string
	schema   string        // oncekit's tables
	role     string        // relay, consumer or both
	ackWait  time.Duration // the visibility timeout the consumer asks for
	lease    time.Duration // the relay's partition lease
}

func main() {
	var o options
	flag.StringVar(&o.queueURL, "queue-url", "", "SQS queue URL (every outbox subject goes to it)")
	flag.StringVar(&o.subject, "subject", "payments", "the outbox subject the consumer reads")
	flag.BoolVar(&o.fifo, "fifo", false, "the queue is a FIFO queue: dedup by event ID, group by key")
	flag.StringVar(&o.dbURL, "database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL")
	flag.StringVar(&o.schema, "schema", oncekit.DefaultSchema, "the schema of oncekit's tables")
	flag.StringVar(&o.role, "role", "both", "what this process runs: relay, consumer or both")
	flag.DurationVar(&o.ackWait, "ack-wait", 30*time.Second, "the consumer's visibility timeout: how soon SQS redelivers what a dead consumer held")
	flag.DurationVar(&o.lease, "lease", 10*time.Second, "the relay's partition lease: how soon another relay takes over from a dead one")
	flag.Parse()
	if err := o.check(); err != nil {
		fmt.Fprintln(os.Stderr, "sqs:", err)
		flag.Usage()
		os.Exit(2)
	}
	// SIGTERM too: ECS and Kubernetes stop a task with it.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, o)
	stop()
	if err != nil && ctx.Err() == nil {
		log.Fatal(err)
	}
}

// check validates the options.
func (o options) check() error {
	switch {
	case o.queueURL == "":
		return errors.New("-queue-url is required")
	case o.role != "relay" && o.role != "consumer" && o.role != "both":
		return fmt.Errorf("-role %q: want relay, consumer or both", o.role)
	}
	return nil
}

// run runs the relay, the consumer or both (per o.role) until ctx ends; if
// one of them fails, the other stops too.
func run(ctx context.Context, o options) error {
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return err
	}
	client := sqs.NewFromConfig(awsCfg)
	pool, err := pgxpool.New(ctx, o.dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	g, ctx := errgroup.WithContext(ctx)
	if o.role != "consumer" {
		g.Go(func() error { return runRelay(ctx, pool, client, o) })
	}
	if o.role != "relay" {
		g.Go(func() error { return runConsumer(ctx, pool, client, o) })
	}
	return g.Wait()
}

// runRelay publishes the outbox to the queue.
func runRelay(ctx context.Context, pool *pgxpool.Pool, client *sqs.Client, o options) error {
	pub, err := sqsbroker.NewPublisher(client, sqsbroker.PublisherConfig{
		QueueURL: func(string) string { return o.queueURL }, FIFO: o.fifo,
	})
	if err != nil {
		return err
	}
	ob, err := outbox.New(&outbox.Config{Schema: o.schema})
	if err != nil {
		return err
	}
	relay, err := outbox.NewRelay(pool, ob, pub, &outbox.RelayConfig{Lease: o.lease})
	if err != nil {
		return err
	}
	return relay.Run(ctx)
}

// runConsumer processes the events of the subject the queue delivers, each
// once.
func runConsumer(ctx context.Context, pool *pgxpool.Pool, client *sqs.Client, o options) error {
	src, err := sqsbroker.NewSource(client, sqsbroker.SourceConfig{QueueURL: o.queueURL, Subject: o.subject, FIFO: o.fifo, AckWait: o.ackWait})
	if err != nil {
		return err
	}
	defer src.Close()
	// Retention above the queue's retention period (4 days by default, 14
	// at most): a copy SQS still holds must find its claim.
	cfg := &inbox.Config{Name: "billing", Schema: o.schema, Retention: 15 * 24 * time.Hour}
	if o.fifo {
		// A FIFO queue hands out a group's next message only once the
		// previous one is deleted, but one receive may carry several of a
		// group: one lane applies them in the order received, up to 10 in
		// a transaction. (The inbox's Ordered mode reads a log SQS does not
		// have.) More processes scale it: SQS gives a group to one at a
		// time.
		cfg.Concurrency, cfg.BatchSize = 1, 10
	}
	c, err := inbox.NewConsumer(pool, src, inbox.HandlerFunc(recordInvoice), cfg)
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

// recordInvoice is the consumer's handler: its write commits with the
// event's claim, so a copy of the event (SQS at least once, a relay's
// re-publish) records nothing more.
func recordInvoice(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO invoices (event_id, body) VALUES ($1, $2)`, msg.ID, msg.Payload)
	return err
}
