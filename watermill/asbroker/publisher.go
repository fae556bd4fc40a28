package asbroker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/cfgerr"
)

// PublisherConfig configures a Publisher. The zero value works.
type PublisherConfig struct {
	// Topic maps a message to the watermill topic it is published to (a
	// RabbitMQ queue or routing key, a Redis stream, a Kafka topic, an SQS
	// queue, depending on the watermill adapter's configuration). Defaults
	// to the message's Subject.
	Topic func(broker.Message) string
	// Concurrency bounds the messages of one Publish call in flight at once.
	// Defaults to 16.
	Concurrency int
	// Connected reports whether the broker is reachable; the relay asks it
	// after failures, to tell an outage (nothing counted against the
	// messages) from messages the broker refuses. Defaults to always true:
	// every failure counts. (watermill-amqp's IsConnected would fit, but it
	// reads the connection state without a lock while a reconnect writes
	// it, which the race detector reports.)
	Connected func() bool
}

// Publisher is a broker.Publisher over any watermill message.Publisher.
//
// Each message is published on its own, so that its result is its own
// (watermill's Publish reports one error for all the messages it is given).
// The messages of one call are in flight together and may be stored in any
// order: the outbox relay sends at most one message per ordering key in a
// call, so keys stay ordered. A message's result is nil once the watermill
// publisher returned nil, which for watermill-amqp with ConfirmDelivery and
// for watermill-redisstream means the broker stored it. Result.Duplicate is
// never set: these brokers do not dedup by ID, and the consumer's claim on
// the event ID absorbs a second copy.
//
// It is safe for concurrent use.
type Publisher struct {
	pub      message.Publisher
	cfg      PublisherConfig
	inFlight sync.WaitGroup // publishes still running after their call returned
}

var _ broker.ConnectedPublisher = (*Publisher)(nil)

// ErrInvalidConfig is returned (wrapped) for a configuration NewPublisher or
// NewSource cannot use: a missing publisher, subscriber or Topics, or a
// negative number; the message names the field.
var ErrInvalidConfig = errors.New("asbroker: invalid config")

// NewPublisher returns a Publisher over pub. The caller keeps owning pub
// and closes it.
func NewPublisher(pub message.Publisher, cfg *PublisherConfig) (*Publisher, error) {
	if pub == nil {
		return nil, fmt.Errorf("%w: publisher is required", ErrInvalidConfig)
	}
	c := cfgerr.CopyOf(cfg)
	if err := cfgerr.For(ErrInvalidConfig, "asbroker: PublisherConfig").IfNegative(c, "Concurrency"); err != nil {
		return nil, err
	}
	c.Concurrency = cmp.Or(c.Concurrency, 16)
	if c.Topic == nil {
		c.Topic = func(m broker.Message) string { return m.Subject }
	}
	if c.Connected == nil {
		c.Connected = func() bool { return true }
	}
	return &Publisher{pub: pub, cfg: c}, nil
}

// Message converts m to a watermill message: the UUID is the event ID, the
// metadata holds m's headers plus broker.HeaderEventID, broker.HeaderMsgID
// (which JetStream dedups on when the watermill publisher is
// watermill-nats) and broker.HeaderKey when m has a key.
func Message(ctx context.Context, m broker.Message) *message.Message {
	id := m.ID.String()
	wm := message.NewMessageWithContext(ctx, id, m.Payload)
	wm.Metadata = make(message.Metadata, len(m.Headers)+3)
	for k, v := range m.Headers {
		wm.Metadata[k] = v
	}
	wm.Metadata[broker.HeaderEventID] = id
	wm.Metadata[broker.HeaderMsgID] = id
	if m.Key != "" {
		wm.Metadata[broker.HeaderKey] = m.Key
	}
	return wm
}

// Publish implements broker.Publisher. When ctx ends first, the messages
// not yet confirmed get ctx's error (they may still be stored: the relay
// publishes them again, and the consumer's claim absorbs the copy).
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	results := make([]broker.Result, len(msgs))
	done := make([]chan error, len(msgs))
	sem := make(chan struct{}, p.cfg.Concurrency)
	for i := range msgs {
		results[i].ID = msgs[i].ID
		done[i] = make(chan error, 1)
		if ctx.Err() == nil {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
			}
		}
		if err := ctx.Err(); err != nil {
			done[i] <- err
			continue
		}
		p.inFlight.Add(1)
		go func() {
			defer p.inFlight.Done()
			defer func() { <-sem }()
			done[i] <- p.publishOne(ctx, msgs[i])
		}()
	}
	for i := range msgs {
		select {
		case err := <-done[i]:
			if err != nil {
				results[i].Err = fmt.Errorf("asbroker: publish %s: %w", msgs[i].ID, err)
			}
		case <-ctx.Done():
			results[i].Err = fmt.Errorf("asbroker: publish %s: %w", msgs[i].ID, ctx.Err())
		}
	}
	return results
}

func (p *Publisher) publishOne(ctx context.Context, m broker.Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("watermill publisher panicked: %v", r)
		}
	}()
	return p.pub.Publish(p.cfg.Topic(m), Message(ctx, m))
}

// Close waits for the publishes still running after their Publish call
// returned (its context ended first), so that the watermill publisher can
// be closed after it. It does not close the watermill publisher.
func (p *Publisher) Close() error {
	p.inFlight.Wait()
	return nil
}

// Connected calls PublisherConfig.Connected. The relay uses it to tell a
// broker outage from messages the broker refuses.
func (p *Publisher) Connected() bool { return p.cfg.Connected() }
