// Package broker is oncekit's seam to message brokers, in both directions.
//
// Outbound, the relay hands a Publisher batches of Message and gets one
// Result per message. Inbound, an inbox.Consumer reads a Source, which hands
// it Delivery values to settle (Ack after commit, Nak with a delay on
// failure). A Window delivers a bounded stretch of the log once, apart from
// the durables, for a consumer to replay (inbox.Consumer.ReplayWindow). The
// guarantees each side relies on are written in the
// interfaces' doc comments, as watermill's message.Publisher and
// message.Subscriber write theirs.
//
// Adapters live in subpackages, one per external system, and depend on this
// package only: broker/natsjs (NATS JetStream) and watermill/asbroker (any
// watermill Publisher and Subscriber: RabbitMQ, Redis Streams, Kafka, SQS,
// ...). broker/brokertest is the conformance suite every adapter passes.
//
// A Publisher may offer capabilities beyond Publish, declared here once:
// ChainPublisher (PublishChain) and ConnectedPublisher (Connected). The
// relay asks for each by type assertion. A decorator of a Publisher builds
// itself with Decorate, which gives it exactly the capabilities of the
// publisher it wraps; brokertest.RunDecorator checks one.
//
// Every message carries its event ID in HeaderEventID (and, on JetStream,
// HeaderMsgID, which the server dedups on). Where a broker cannot dedup by
// event ID, the inbox's claim on that ID is the dedup.
package broker
