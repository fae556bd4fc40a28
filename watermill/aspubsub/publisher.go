package aspubsub

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/cfgerr"
	"github.com/oncekit/oncekit/outbox"
)

// HeaderUUID carries a watermill message's UUID through the outbox and the
// broker, so that the Subscriber hands the message back with it.
const HeaderUUID = "Oncekit-Watermill-Uuid"

// PublisherConfig configures a Publisher. The zero value works.
type PublisherConfig struct {
	// Outbox is the outbox's configuration (Schema, payload
	// limit). Defaults to the zero outbox.Config.
	Outbox outbox.Config
	// Key returns the ordering key of a message published to topic.
	// Defaults to the Oncekit-Key metadata when set, else the topic: a
	// topic then keeps publish order, as a queue does. Return a finer key
	// (an aggregate ID) to spread a busy topic over the relay's partitions.
	Key func(topic string, msg *message.Message) string
}

// Publisher is a message.Publisher that writes each message to oncekit's
// outbox, through the Beginner it was made with: in the caller's transaction, as
// watermill-sql's publisher does. The relay then publishes it to the broker
// with the event ID as its identity, at least once; consumers dedup on it.
//
// A message's event ID is its Oncekit-Event-Id metadata when that is a
// UUID, else oncekit.DeriveID("watermill", topic, msg.UUID): publishing the
// same watermill message to one topic twice is one event (the second
// Enqueue is a no-op), to two topics two events. Publish uses the first
// message's context.
type Publisher struct {
	db  oncekit.Beginner
	ob  *outbox.Outbox
	key func(string, *message.Message) string
}

var _ message.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher writing through db: the caller's pgx.Tx
// (the messages then commit or roll back with it; each Publish is a
// savepoint in it) or a *pgxpool.Pool (each Publish is its own
// transaction).
func NewPublisher(db oncekit.Beginner, cfg *PublisherConfig) (*Publisher, error) {
	if db == nil {
		return nil, errors.New("aspubsub: NewPublisher: db is required")
	}
	c := cfgerr.CopyOf(cfg)
	ob, err := outbox.New(&c.Outbox)
	if err != nil {
		return nil, fmt.Errorf("aspubsub: %w", err)
	}
	if c.Key == nil {
		c.Key = func(topic string, m *message.Message) string {
			if k := m.Metadata.Get(broker.HeaderKey); k != "" {
				return k
			}
			return topic
		}
	}
	return &Publisher{db: db, ob: ob, key: c.Key}, nil
}

// EventID returns the event ID the Publisher gives msg on topic.
func EventID(topic string, msg *message.Message) uuid.UUID {
	if id, err := uuid.Parse(msg.Metadata.Get(broker.HeaderEventID)); err == nil && id != uuid.Nil {
		return id
	}
	return oncekit.DeriveID("watermill", topic, msg.UUID)
}

// Publish writes msgs to the outbox for topic, all or none.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	ctx := msgs[0].Context()
	out := make([]broker.Message, len(msgs))
	for i, m := range msgs {
		h := make(map[string]string, len(m.Metadata)+1)
		for k, v := range m.Metadata {
			switch k {
			case broker.HeaderEventID, broker.HeaderKey, broker.HeaderMsgID:
				continue // carried by the message itself
			}
			h[k] = v
		}
		h[HeaderUUID] = m.UUID
		out[i] = broker.Message{ID: EventID(topic, m), Subject: topic, Key: p.key(topic, m), Payload: m.Payload, Headers: h}
	}
	tx, err := p.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("aspubsub: publish to %s: begin: %w", topic, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // no-op after Commit
	if _, err := p.ob.Enqueue(ctx, tx, out...); err != nil {
		return fmt.Errorf("aspubsub: publish to %s: %w", topic, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("aspubsub: publish to %s: commit: %w", topic, err)
	}
	return nil
}

// Close does nothing: the Publisher holds no resources of its own.
func (p *Publisher) Close() error { return nil }
