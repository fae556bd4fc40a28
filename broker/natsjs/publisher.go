package natsjs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/cfgerr"
)

// PublisherConfig configures a Publisher. The zero value works.
type PublisherConfig struct {
	// MaxPending bounds the messages in flight without an ack. Defaults to
	// 4096. The bound in force is lower while acks time out (see
	// InFlightLimit).
	MaxPending int
	// AckTimeout is how long a message waits for JetStream's ack before
	// its publish fails with jetstream.ErrAsyncPublishTimeout, freeing its
	// place among the MaxPending. A publish forwarded to a stream leader
	// that dies is never answered, and the connection stays up, so nothing
	// else frees its place: without a bound, each leader death would take
	// a few places for good. Defaults to 30 s, a relay's PublishTimeout:
	// set it to the relay's PublishTimeout, so that a publish the relay
	// gave up on frees its place then.
	AckTimeout time.Duration
}

// Publisher publishes batches to JetStream asynchronously, with
// Nats-Msg-Id = message ID. It is safe for concurrent use.
type Publisher struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	win *inflight
}

var (
	_ broker.ChainPublisher     = (*Publisher)(nil)
	_ broker.ConnectedPublisher = (*Publisher)(nil)
)

// ErrInvalidConfig is wrapped by the error NewPublisher, NewSource and
// EnsureStream return for a bad argument or Config: a nil connection or
// JetStream context, a missing required field, a negative value. The
// error's text names the argument or the field.
var ErrInvalidConfig = errors.New("natsjs: invalid config")

// NewPublisher returns a Publisher over nc. It creates its own JetStream
// context so that its async-publish window does not interfere with others.
func NewPublisher(nc *nats.Conn, cfg *PublisherConfig) (*Publisher, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: NewPublisher: nil connection", ErrInvalidConfig)
	}
	c := cfgerr.CopyOf(cfg)
	if err := cfgerr.For(ErrInvalidConfig, "natsjs: PublisherConfig").IfNegative(c, "MaxPending", "AckTimeout"); err != nil {
		return nil, err
	}
	maxPending, ackTimeout := cmp.Or(c.MaxPending, 4096), cmp.Or(c.AckTimeout, 30*time.Second)
	win := newInflight(maxPending, ackTimeout)
	js, err := jetstream.New(nc, append(win.options(),
		jetstream.WithPublishAsyncMaxPending(maxPending),
		jetstream.WithPublishAsyncTimeout(ackTimeout))...)
	if err != nil {
		return nil, fmt.Errorf("natsjs: %w", err)
	}
	return &Publisher{nc: nc, js: js, win: win}, nil
}

// InFlightLimit returns how many publishes p lets wait for their acks now:
// MaxPending, halved when publishes time out unacknowledged (AckTimeout),
// at most once per flight of publishes and not below 16, and grown back by
// one at each ack. A JetStream cluster too slow to answer in time is so
// sent less, instead of the same publishes again as its callers retry.
func (p *Publisher) InFlightLimit() int { return p.win.limitNow() }

// NATSMsg converts m to a NATS message with oncekit's headers set.
func NATSMsg(m broker.Message) *nats.Msg {
	// The header map is sized once for everything it will hold, and the ID
	// is formatted once for both headers that carry it.
	h := make(nats.Header, len(m.Headers)+3)
	for k, v := range m.Headers {
		h.Set(k, v)
	}
	id := m.ID.String()
	h[broker.HeaderMsgID] = []string{id}
	h[broker.HeaderEventID] = []string{id}
	if m.Key != "" {
		h[broker.HeaderKey] = []string{m.Key}
	}
	return &nats.Msg{Subject: m.Subject, Data: m.Payload, Header: h}
}

// ErrNotSent is the result of a message PublishChain did not send because
// its predecessor failed.
var ErrNotSent = errors.New("natsjs: not sent: an earlier message of its chain failed")

// Publish implements broker.Publisher: every message is sent asynchronously,
// then each ack is awaited; results come back in input order. When the
// publishes in flight reach InFlightLimit, sending waits for room until ctx
// ends.
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	return p.PublishChain(ctx, msgs, nil)
}

// PublishChain is Publish with ordering constraints: when prev[i] >= 0,
// msgs[i] is sent only after msgs[prev[i]] (prev[i] < i) was acknowledged,
// and not at all (ErrNotSent) when that one failed. Independent chains are in
// flight together, so a batch holding several messages per ordering key needs
// no round trip per message. A nil prev means no constraints.
func (p *Publisher) PublishChain(ctx context.Context, msgs []broker.Message, prev []int) []broker.Result {
	results := make([]broker.Result, len(msgs))
	futures := make([]jetstream.PubAckFuture, len(msgs))
	next := make([]int, len(msgs))
	for i := range next {
		next[i] = -1
	}
	for i := range msgs {
		results[i].ID = msgs[i].ID
		if prev != nil && prev[i] >= 0 {
			next[prev[i]] = i
		}
	}
	for i := range msgs {
		if prev == nil || prev[i] < 0 {
			p.send(ctx, msgs, futures, results, i)
		}
	}
	for i := range msgs {
		if futures[i] == nil {
			if results[i].Err == nil {
				results[i].Err = ErrNotSent
			}
			continue
		}
		if !p.await(ctx, futures, results, msgs, i) {
			for j := i; j < len(msgs); j++ {
				if results[j].Err == nil && results[j].Sequence == 0 {
					results[j].Err = ctx.Err()
				}
			}
			return results
		}
		if results[i].Err == nil && next[i] >= 0 {
			p.send(ctx, msgs, futures, results, next[i])
		}
	}
	return results
}

// send publishes msgs[i] asynchronously, waiting for room among the
// publishes in flight until ctx ends. The Nats-Msg-Id header NATSMsg sets
// is the one JetStream deduplicates on, so no WithMsgID option (and no
// second formatting of the ID) is needed.
func (p *Publisher) send(ctx context.Context, msgs []broker.Message, futures []jetstream.PubAckFuture, results []broker.Result, i int) {
	m := &msgs[i]
	if err := p.win.take(ctx); err != nil {
		results[i].Err = fmt.Errorf("natsjs: publish %s: waiting for room among the publishes in flight: %w", m.ID, err)
		return
	}
	stall := 30 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		stall = max(time.Until(dl), time.Millisecond)
	}
	f, err := p.js.PublishMsgAsync(NATSMsg(*m), jetstream.WithStallWait(stall))
	if err != nil {
		p.win.failed(err)
		results[i].Err = fmt.Errorf("natsjs: publish %s: %w", m.ID, err)
		return
	}
	futures[i] = f
}

// await fills results[i] from futures[i]; it reports false when ctx ended
// first.
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
		return false
	}
}

// Connected reports whether the connection to NATS is up. A relay uses it to
// tell a broker outage (nothing counted against the messages) from messages
// the broker rejects.
func (p *Publisher) Connected() bool { return p.nc.IsConnected() }
