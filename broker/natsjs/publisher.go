package natsjs

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/broker"
)

// PublisherConfig configures a Publisher. The zero value works.
type PublisherConfig struct {
	// MaxPending bounds the messages in flight without an ack. Defaults to 4096.
	MaxPending int
}

// Publisher publishes batches to JetStream asynchronously, with
// Nats-Msg-Id = message ID. It is safe for concurrent use.
type Publisher struct {
	nc *nats.Conn
	js jetstream.JetStream
}

var _ broker.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher over nc. It creates its own JetStream
// context so that its async-publish window does not interfere with others.
func NewPublisher(nc *nats.Conn, cfg *PublisherConfig) (*Publisher, error) {
	if nc == nil {
		return nil, errors.New("natsjs: NewPublisher: nil connection")
	}
	c := PublisherConfig{}
	if cfg != nil {
		c = *cfg
	}
	if c.MaxPending <= 0 {
		c.MaxPending = 4096
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(c.MaxPending))
	if err != nil {
		return nil, fmt.Errorf("natsjs: %w", err)
	}
	return &Publisher{nc: nc, js: js}, nil
}

// NATSMsg converts m to a NATS message with oncekit's headers set.
func NATSMsg(m broker.Message) *nats.Msg {
	out := nats.NewMsg(m.Subject)
	out.Data = m.Payload
	for k, v := range m.Headers {
		out.Header.Set(k, v)
	}
	id := m.ID.String()
	out.Header.Set(broker.HeaderMsgID, id)
	out.Header.Set(broker.HeaderEventID, id)
	if m.Key != "" {
		out.Header.Set(broker.HeaderKey, m.Key)
	}
	return out
}

// Publish implements broker.Publisher: every message is sent asynchronously,
// then each ack is awaited; results come back in input order.
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	results := make([]broker.Result, len(msgs))
	futures := make([]jetstream.PubAckFuture, len(msgs))
	for i, m := range msgs {
		results[i].ID = m.ID
		f, err := p.js.PublishMsgAsync(NATSMsg(m), jetstream.WithMsgID(m.ID.String()))
		if err != nil {
			results[i].Err = fmt.Errorf("natsjs: publish %s: %w", m.ID, err)
			continue
		}
		futures[i] = f
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case ack := <-f.Ok():
			results[i].Sequence = ack.Sequence
			results[i].Duplicate = ack.Duplicate
		case err := <-f.Err():
			results[i].Err = fmt.Errorf("natsjs: publish %s: %w", msgs[i].ID, err)
		case <-ctx.Done():
			for j := i; j < len(futures); j++ {
				if futures[j] != nil && results[j].Err == nil && results[j].Sequence == 0 {
					results[j].Err = ctx.Err()
				}
			}
			return results
		}
	}
	return results
}

// Connected reports whether the connection to NATS is up. A relay uses it to
// tell a broker outage (nothing counted against the messages) from messages
// the broker rejects.
func (p *Publisher) Connected() bool { return p.nc.IsConnected() }
