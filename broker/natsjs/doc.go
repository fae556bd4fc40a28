// Package natsjs adapts NATS JetStream (the nats.go jetstream package) to
// oncekit's broker interfaces (package broker), both directions.
//
// The Publisher publishes a batch asynchronously with Nats-Msg-Id set to each
// message's ID and reports each acknowledgement. JetStream drops a message
// whose Nats-Msg-Id it has already stored within the stream's Duplicates
// window, so a relay that re-publishes after a crash does not create a second
// copy as long as it re-publishes within that window. EnsureStream creates or
// updates a stream with an explicit window.
//
// The Source reads a durable pull consumer with explicit acks. What JetStream
// delivers ahead of the consumer is held in the Source and signalled in
// progress until Receive hands it out, so that a slow consumer is not
// redelivered what it holds; Close hands it back at once.
//
// The Source is an broker.OrderedSource: for ordered consumers it reports the
// durable's ack floor and reads the stream's headers (an ordered consumer of
// its own, headers only, no acks) to show the messages other processes of
// the durable hold.
//
// A Window (NewWindow) reads a stretch of a stream, from a sequence or a
// time to a sequence, a time or the stream's end, with an ordered consumer
// of its own: the inbox replays it through a consumer's handler after an
// asynchronous PostgreSQL failover erased effects already acked.
package natsjs
