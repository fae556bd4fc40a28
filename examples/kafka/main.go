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
// claim on the event ID is what dedups it. A partition keeps order, so key
// the messages (the Oncekit-Key header) to keep a key's order: the example
// sets watermill-kafka's partitioning marshaler to partition by it.
//
//	go run . -brokers 127.0.0.1:9092 -topic payments
package main

import (
	"context"
	"flag"
	"log"
	"os"
	"os/signal"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/watermill/asbroker"
)

func main() {
	brokers := flag.String("brokers", "127.0.0.1:9092", "Kafka brokers, comma-separated")
	topic := flag.String("topic", "payments", "Kafka topic")
	dbURL := flag.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, strings.Split(*brokers, ","), *topic, *dbURL); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, brokers []string, topic, dbURL string) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	logger := watermill.NewSlogLogger(nil)

	// Partition by the ordering key, so that a key's messages stay in one
	// partition, in order.
	marshaler := kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
		return msg.Metadata.Get(broker.HeaderKey), nil
	})
	pubCfg := kafka.PublisherConfig{Brokers: brokers, Marshaler: marshaler}
	wpub, err := kafka.NewPublisher(pubCfg, logger)
	if err != nil {
		return err
	}
	defer wpub.Close()
	pub, err := asbroker.NewPublisher(wpub, nil)
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

	wsub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: brokers, Unmarshaler: marshaler, ConsumerGroup: "billing",
	}, logger)
	if err != nil {
		return err
	}
	defer wsub.Close()
	src, err := asbroker.NewSource(ctx, wsub, &asbroker.SourceConfig{Topics: []string{topic}})
	if err != nil {
		return err
	}
	defer src.Close()
	c, err := inbox.NewConsumer(pool, src, inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO invoices (event_id, body) VALUES ($1, $2)`, msg.ID, msg.Payload)
		return err
	}), &inbox.Config{Name: "billing"})
	if err != nil {
		return err
	}

	// The relay and the consumer run until ctx ends; if one of them fails,
	// the other stops too.
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return relay.Run(ctx) })
	g.Go(func() error { return c.Run(ctx) })
	return g.Wait()
}
