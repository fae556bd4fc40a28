// Command sqs wires oncekit to Amazon SQS through the sketch adapter in
// sqsbroker: the relay publishes the outbox to a queue, and an inbox
// consumer processes it, each event once. See sqsbroker's documentation for
// what dedup rests on (FIFO queues: SQS's 5-minute deduplication by event
// ID, then the inbox claim; standard queues: the inbox claim alone).
//
// It lives in a module of its own so that the AWS SDK stays out of
// oncekit's go.mod. It compiles and is vetted in CI, but is not run: there
// is no SQS on the development or CI machines.
//
//	go run . -queue-url https://sqs.eu-west-1.amazonaws.com/123456789012/payments.fifo -fifo
package main

import (
	"context"
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
}

func main() {
	var o options
	flag.StringVar(&o.queueURL, "queue-url", "", "SQS queue URL (every outbox subject goes to it)")
	flag.StringVar(&o.subject, "subject", "payments", "the outbox subject the consumer reads")
	flag.BoolVar(&o.fifo, "fifo", false, "the queue is a FIFO queue: dedup by event ID, group by key")
	flag.StringVar(&o.dbURL, "database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL")
	flag.Parse()
	if o.queueURL == "" {
		fmt.Fprintln(os.Stderr, "sqs: -queue-url is required")
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

// run runs the relay and the consumer until ctx ends; if one of them fails,
// the other stops too.
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
	g.Go(func() error { return runRelay(ctx, pool, client, o) })
	g.Go(func() error { return runConsumer(ctx, pool, client, o) })
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
	ob, err := outbox.New(nil)
	if err != nil {
		return err
	}
	relay, err := outbox.NewRelay(pool, ob, pub, nil)
	if err != nil {
		return err
	}
	return relay.Run(ctx)
}

// runConsumer processes the events of the subject the queue delivers, each
// once.
func runConsumer(ctx context.Context, pool *pgxpool.Pool, client *sqs.Client, o options) error {
	src, err := sqsbroker.NewSource(client, sqsbroker.SourceConfig{QueueURL: o.queueURL, Subject: o.subject, FIFO: o.fifo})
	if err != nil {
		return err
	}
	defer src.Close()
	// Retention above the queue's retention period (4 days by default, 14
	// at most): a copy SQS still holds must find its claim.
	c, err := inbox.NewConsumer(pool, src, inbox.HandlerFunc(recordInvoice), &inbox.Config{Name: "billing", Retention: 15 * 24 * time.Hour})
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
