package asbroker_test

import (
	"context"
	"log"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/watermill/asbroker"
)

// The relay publishing to, and the inbox consuming from, any watermill
// pub/sub; RabbitMQ's, say (watermill-amqp, with Publish.ConfirmDelivery set
// so that Publish returns once RabbitMQ stored the message).
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/postgres")
	if err != nil {
		log.Fatal(err)
	}
	var wpub message.Publisher  // amqp.NewPublisher(cfg, logger)
	var wsub message.Subscriber // amqp.NewSubscriber(cfg, logger)

	pub, err := asbroker.NewPublisher(wpub, nil)
	if err != nil {
		log.Fatal(err)
	}
	ob, err := outbox.New(nil) // the writers' outbox
	if err != nil {
		log.Fatal(err)
	}
	relay, err := outbox.NewRelay(pool, ob, pub, nil)
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = relay.Run(ctx) }()

	src, err := asbroker.NewSource(ctx, wsub, &asbroker.SourceConfig{Topics: []string{"payments"}})
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
