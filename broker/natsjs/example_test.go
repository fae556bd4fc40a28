package natsjs_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
)

// Create a stream with an explicit dedup window and publish a batch; each
// message's ID becomes its Nats-Msg-Id, so publishing it again is absorbed.
func ExamplePublisher_Publish() {
	ctx := context.Background()
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{
		Name: "ORDERS", Subjects: []string{"orders.>"}, Duplicates: 15 * time.Minute,
	}); err != nil {
		log.Fatal(err)
	}
	pub, err := natsjs.NewPublisher(nc, nil)
	if err != nil {
		log.Fatal(err)
	}
	msg := broker.Message{ID: oncekit.DeriveID("order-1", "OrderPlaced"), Subject: "orders.placed", Key: "order-1", Payload: []byte(`{}`)}
	for _, r := range pub.Publish(ctx, []broker.Message{msg, msg}) {
		fmt.Println(r.Err, r.Duplicate)
	}
}
