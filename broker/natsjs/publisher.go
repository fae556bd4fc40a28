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
// then each ack is awaited; results come back in input order. When the
// async window (MaxPending) is full, it first awaits its own oldest acks.
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	results := make([]broker.Result, len(msgs))
	futures := make([]jetstream.PubAckFuture, len(msgs))
	awaited := 0 // futures[:awaited] have their result
	for i, m := range msgs {
		results[i].ID = m.ID
		for {
			f, err := p.js.PublishMsgAsync(NATSMsg(m), jetstream.WithMsgID(m.ID.String()))
			if err == nil {
				futures[i] = f
				break
			}
			if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) || ctx.Err() != nil {
				results[i].Err = fmt.Errorf("natsjs: publish %s: %w", m.ID, err)
				break
			}
			// The window is full: make room by awaiting our oldest ack, or
			// anyone's when none of ours is pending.
			for awaited < i && futures[awaited] == nil {
				awaited++
			}
			if awaited < i {
				if !p.await(ctx, futures, results, msgs, awaited) {
					return results
				}
				awaited++
				continue
			}
			select {
			case <-p.js.PublishAsyncComplete():
			case <-ctx.Done():
			}
		}
	}
	for i := awaited; i < len(futures); i++ {
		if futures[i] == nil {
			continue
		}
		if !p.await(ctx, futures, results, msgs, i) {
			return results
		}
	}
	return results
}

// await fills results[i] from futures[i]. When ctx ends first it sets the
// context error on every result still open and reports false.
func (p *Publisher) await(ctx context.Context, futures []jetstream.PubAckFuture, results []broker.Result, msgs []broker.Message, i int) bool {
	select {
	case ack := <-futures[i].Ok():
		results[i].Sequence = ack.Sequence
		results[i].Duplicate = ack.Duplicate
		return true
	case err := <-futures[i].Err():
		results[i].Err = fmt.Errorf("natsjs: publish %s: %w", msgs[i].ID, err)
		return true
	case <-ctx.Done():
		for j := i; j < len(futures); j++ {
			if results[j].Err == nil && results[j].Sequence == 0 {
				results[j].Err = ctx.Err()
			}
		}
		return false
	}
}

// Connected reports whether the connection to NATS is up. A relay uses it to
// tell a broker outage (nothing counted against the messages) from messages
// the broker rejects.
func (p *Publisher) Connected() bool { return p.nc.IsConnected() }
