package broker

import (
	"context"

	"github.com/google/uuid"
)

// Headers oncekit sets on every message it publishes.
const (
	// HeaderMsgID is JetStream's dedup header; oncekit sets it to the event ID.
	HeaderMsgID = "Nats-Msg-Id"
	// HeaderEventID carries the event ID for brokers without HeaderMsgID.
	HeaderEventID = "Oncekit-Event-Id"
	// HeaderKey carries the ordering key, when the message has one.
	HeaderKey = "Oncekit-Key"
)

// Message is one event on its way to or from the broker.
type Message struct {
	// ID is the event's identity: stable across retries and republishing,
	// usually from oncekit.DeriveID. Consumers dedup on it.
	ID uuid.UUID
	// Subject is where the message is published.
	Subject string
	// Key is the ordering key (an aggregate ID): messages with the same key are
	// delivered in order. Empty means no ordering constraint.
	Key string
	// Payload is the message body.
	Payload []byte
	// Headers are extra application headers.
	Headers map[string]string
}

// Result is the broker's answer for one message of a batch.
type Result struct {
	// ID is the message's ID.
	ID uuid.UUID
	// Err is nil when the broker durably accepted the message.
	Err error
	// Duplicate is true when the broker recognised the ID as already stored.
	Duplicate bool
	// Sequence is the broker's position for the message, when it has one.
	Sequence uint64
}

// Publisher publishes messages; the outbox relay is its user.
//
// Publish sends msgs and returns exactly one Result per message, in the same
// order. A nil Err means the broker acknowledged the message durably; a non-nil
// Err means it may or may not have stored it (the caller retries with the same
// ID, and the broker's dedup or the consumer's absorbs a second copy). Publish
// returns early with context errors for the messages not yet acknowledged when
// ctx ends.
//
// Publish promises no order among the messages of one call: the relay puts at
// most one message of an ordering key in a call (or, with natsjs, chains a
// key's messages through PublishChain), so a key's messages are stored in
// order whenever the broker stores in arrival order. Every message carries
// its ID in HeaderEventID (and HeaderMsgID, which JetStream dedups on) and its
// Key in HeaderKey, for the consumer. Implementations must be safe for
// concurrent use.
type Publisher interface {
	Publish(ctx context.Context, msgs []Message) []Result
}
