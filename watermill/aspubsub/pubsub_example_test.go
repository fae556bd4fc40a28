package aspubsub_test

import (
	"context"
	"log"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/watermill/aspubsub"
)

// A watermill router on oncekit: the event is written to the outbox in the
// business transaction, the relay (running elsewhere) publishes it to
// JetStream, and the router's handler gets it through the inbox.
func ExampleNewSubscriber() {
	ctx := context.Background()
	var pool *pgxpool.Pool     // the service's pool
	var js jetstream.JetStream // on the NATS the relay publishes to
	var router *message.Router // the service's watermill router

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	// ... the business writes, in tx ...
	pub, err := aspubsub.NewPublisher(tx, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := pub.Publish("orders.placed", message.NewMessage(watermill.NewUUID(), []byte(`{"order":"42"}`))); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}

	sub, err := aspubsub.NewSubscriber(pool, &aspubsub.SubscriberConfig{
		Group: "billing",
		Source: func(ctx context.Context, group, topic string) (broker.Source, func(), error) {
			src, err := natsjs.NewSource(ctx, js, &natsjs.SourceConfig{Stream: "ORDERS", Durable: group, FilterSubjects: []string{topic}})
			if err != nil {
				return nil, nil, err
			}
			return src, src.Close, nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	router.AddNoPublisherHandler("billing", "orders.placed", sub, func(msg *message.Message) error {
		log.Printf("order placed: %s", msg.Payload)
		return nil
	})
}
