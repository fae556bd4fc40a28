// Package asbroker presents any watermill Pub/Sub as oncekit's broker:
// the outbox relay publishes through a watermill message.Publisher
// (Publisher), and the inbox consumes a watermill message.Subscriber
// (Source). Its sibling, watermill/aspubsub, goes the other way: oncekit
// as a watermill Pub/Sub. It depends on package broker and watermill
// only, and passes broker/brokertest on RabbitMQ (watermill-amqp), Redis
// Streams (watermill-redisstream) and Kafka (watermill-kafka, in
// examples/kafka).
//
// Every guarantee of the inbox holds: the consumer claims each message's
// event ID in processed_messages in the handler's transaction and acks only
// after commit; the Source nacks what is not settled in time. Since these
// brokers do not dedup by message ID, the claim is the dedup: a message the
// relay publishes twice (it died between publish and mark) is delivered
// twice and processed once.
//
//	cfg := amqp.NewDurableQueueConfig(uri)
//	cfg.Publish.ConfirmDelivery = true // Publish returns once RabbitMQ stored the message
//	wpub, _ := amqp.NewPublisher(cfg, logger)
//	pub, _ := asbroker.NewPublisher(wpub, nil)
//	relay, _ := outbox.NewRelay(pool, ob, pub, nil)
//
//	wsub, _ := amqp.NewSubscriber(cfg, logger)
//	src, _ := asbroker.NewSource(ctx, wsub, &asbroker.SourceConfig{Topics: []string{"payments"}})
//	consumer, _ := inbox.NewConsumer(pool, src, handler, &inbox.Config{Name: "billing"})
//
// Close the Publisher before the watermill publisher: it waits for the
// publishes its calls left running when their context ended.
//
// With RabbitMQ, declare the queues before the relay publishes (a
// subscriber's SubscribeInitialize, or the Source): RabbitMQ drops a message
// published to a queue that does not exist, and confirms it.
// docs/brokers.md compares the brokers.
package asbroker
