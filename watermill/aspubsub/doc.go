// Package aspubsub presents oncekit as a watermill Pub/Sub, for watermill
// users, with their router unchanged. Its sibling, watermill/asbroker, goes
// the other way: any watermill Pub/Sub as oncekit's broker.
//
// As a watermill Pub/Sub: Publisher is a message.Publisher that writes to
// oncekit's outbox in the caller's transaction (as watermill-sql's publisher
// does), and Subscriber is a message.Subscriber fed by the relay and the
// inbox: each topic is read by an inbox.Consumer whose claim, per consumer
// group, commits when the watermill handler acks. It passes watermill's
// universal suite (pubsub/tests.TestPubSub) on PostgreSQL and NATS
// JetStream. The relay runs as usual (outbox.Relay, or `oncekit relay`).
//
//	// In the business transaction:
//	pub, _ := aspubsub.NewPublisher(tx, nil)
//	_ = pub.Publish("orders.placed", message.NewMessage(watermill.NewUUID(), payload))
//
//	sub, _ := aspubsub.NewSubscriber(pool, &aspubsub.SubscriberConfig{Group: "billing", Source: openSource})
//	router.AddNoPublisherHandler("billing", "orders.placed", sub, handle)
//
// As router handlers with the claim in the handler's transaction (Inbox):
// each message is claimed in processed_messages in the same PostgreSQL
// transaction as the handler's writes, the transaction is passed to the
// handler explicitly, and watermill acks only after commit; this works on
// any watermill subscriber.
//
//	in, _ := aspubsub.New(pool, &aspubsub.Config{Name: "billing"})
//	router.AddNoPublisherHandler("billing", "payments", sub,
//		in.NoPublishHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
//			_, err := tx.Exec(ctx, "INSERT INTO invoices ...")
//			return err
//		}))
//
// Watermill's handler signature has no room for a transaction, and a
// transaction the handler must use is best a parameter it cannot miss, so
// instead of a message.HandlerMiddleware the package adapts a handler that
// takes the transaction into a message.HandlerFunc; watermill middleware (Retry,
// PoisonQueue, Recoverer) composes around it as usual.
//
// Per message: the message ID is read (Config.MessageID; by default the
// Oncekit-Event-Id or Nats-Msg-Id metadata, else the watermill UUID when it is
// a UUID), the claim is inserted with ON CONFLICT DO NOTHING, and the handler
// runs only if the claim is new. A duplicate returns nil (acked). A handler
// error rolls back and is returned (nacked: the subscriber redelivers). A
// Permanent error or a message without a valid ID is written to dead_letters
// and acked. A failed COMMIT is returned as an error, never acked: the
// redelivery finds the claim if the commit did land.
//
// Messages the handler returns are published by the router after the commit,
// at most once: if that publish fails (or the process dies before it), the
// message is redelivered, found a duplicate, and its handler, which alone
// could produce them, does not run again. To publish them with the handler's
// writes, write them to the outbox in tx instead.
//
// The other direction, oncekit's relay and inbox on any watermill broker
// (RabbitMQ, Redis Streams, Kafka, SQS), is package watermill/asbroker.
package aspubsub
