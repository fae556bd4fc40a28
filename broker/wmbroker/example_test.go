package wmbroker_test

import (
	"context"
	"log"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/broker/wmbroker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/outbox"
)

// The relay publishing to RabbitMQ and the inbox consuming from it, through
// watermill-amqp.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/postgres")
	if err != nil {
		log.Fatal(err)
	}
	cfg := amqp.NewDurableQueueConfig("amqp://guest:guest@127.0.0.1:5672/")
	cfg.Publish.ConfirmDelivery = true // Publish returns once RabbitMQ stored the message

	wpub, err := amqp.NewPublisher(cfg, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	pub, err := wmbroker.NewPublisher(wpub, nil)
	if err != nil {
		log.Fatal(err)
	}
	relay, err := outbox.NewRelay(pool, pub, nil)
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = relay.Run(ctx) }()

	wsub, err := amqp.NewSubscriber(cfg, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	src, err := wmbroker.NewSource(ctx, wsub, &wmbroker.SourceConfig{Topics: []string{"payments"}})
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()
	c, err := inbox.NewConsumer(pool, src, inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO invoices (event_id, body) VALUES ($1, $2)`, msg.ID, msg.Payload)
		return err
	}), &inbox.Config{Name: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	_ = c.Run(ctx)
}
