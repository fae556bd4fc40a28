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

	"github.com/oncekit/oncekit/examples/sqs/sqsbroker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/outbox"
)

func main() {
	queueURL := flag.String("queue-url", "", "SQS queue URL (every outbox subject goes to it)")
	subject := flag.String("subject", "payments", "the outbox subject the consumer reads")
	fifo := flag.Bool("fifo", false, "the queue is a FIFO queue: dedup by event ID, group by key")
	dbURL := flag.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL")
	flag.Parse()
	if *queueURL == "" {
		fmt.Fprintln(os.Stderr, "sqs: -queue-url is required")
		flag.Usage()
		os.Exit(2)
	}
	// SIGTERM too: ECS and Kubernetes stop a task with it.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, *queueURL, *subject, *fifo, *dbURL)
	stop()
	if err != nil && ctx.Err() == nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, queueURL, subject string, fifo bool, dbURL string) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return err
	}
	client := sqs.NewFromConfig(awsCfg)

	pub, err := sqsbroker.NewPublisher(client, sqsbroker.PublisherConfig{
		QueueURL: func(string) string { return queueURL }, FIFO: fifo,
	})
	if err != nil {
		return err
	}
	relay, err := outbox.NewRelay(pool, pub, nil)
	if err != nil {
		return err
	}
	go func() { _ = relay.Run(ctx) }()

	src, err := sqsbroker.NewSource(client, sqsbroker.SourceConfig{QueueURL: queueURL, Subject: subject, FIFO: fifo})
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
