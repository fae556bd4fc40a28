package aspubsub

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/cfgerr"
)

// OpenSource opens the broker source a Subscriber reads topic from for
// group: every source opened for one (group, topic) must share its
// messages (one durable consumer, one queue, one consumer group), and
// different groups must each get every message. close releases it.
type OpenSource func(ctx context.Context, group, topic string) (src broker.Source, close func(), err error)

// SubscriberConfig configures a Subscriber. Source is required.
type SubscriberConfig struct {
	// Group is the consumer group: Subscribers of one group share a
	// topic's messages, each group gets them all. Defaults to "default".
	Group string
	// Source opens the broker source of a topic. Required.
	Source OpenSource
	// Schema of oncekit's tables. Defaults to oncekit.DefaultSchema.
	Schema string
	// MinBackoff and MaxBackoff bound the wait before a nacked message is
	// handed out again, doubling from the first to the second. Default to
	// 10ms and 5s.
	MinBackoff, MaxBackoff time.Duration
	// MaxAttempts is the delivery after whose nack a message goes to
	// dead_letters instead. Defaults to 25.
	MaxAttempts int
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Subscriber is a message.Subscriber fed by the relay and the inbox. Each
// Subscribe runs an inbox.Consumer on the topic's source, claim name
// "<group>/<topic>", in ordered mode with one message at a time: a message
// is handed to watermill inside the transaction that claims it, and the
// claim commits when watermill acks it (then the broker is acked). A nack
// rolls the claim back and the message is handed out again after the backoff,
// before the topic's next message. A message whose claim already committed
// (a redelivery, a copy the relay published twice) is acked without
// reaching watermill again.
//
// Delivery to watermill is at least once: a process that dies after the ack
// and before its commit hands the message out again. Handlers that write to
// PostgreSQL get exactly-once writes with Inbox instead.
type Subscriber struct {
	db  oncekit.DB
	cfg SubscriberConfig
	log *slog.Logger

	mu     sync.Mutex
	closed bool
	subs   sync.WaitGroup
	stop   chan struct{}
}

var _ message.Subscriber = (*Subscriber)(nil)

// ErrSubscriberClosed is returned by Subscribe after Close.
var ErrSubscriberClosed = errors.New("aspubsub: subscriber closed")

// NewSubscriber returns a Subscriber claiming in db (a *pgxpool.Pool).
func NewSubscriber(db oncekit.DB, cfg *SubscriberConfig) (*Subscriber, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db is required", inbox.ErrInvalidConfig)
	}
	c := cfgerr.CopyOf(cfg)
	bad := cfgerr.For(inbox.ErrInvalidConfig, "aspubsub: SubscriberConfig")
	if c.Source == nil {
		return nil, bad("Source", "required")
	}
	if err := bad.IfNegative(c, "MaxAttempts"); err != nil {
		return nil, err
	}
	if c.Group == "" {
		c.Group = "default"
	}
	c.MinBackoff = cmp.Or(c.MinBackoff, 10*time.Millisecond)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, max(5*time.Second, c.MinBackoff))
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return &Subscriber{db: db, cfg: c, log: c.Logger.With("group", c.Group), stop: make(chan struct{})}, nil
}

// Subscribe implements message.Subscriber. The channel closes when ctx
// ends or the Subscriber is closed.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrSubscriberClosed
	}
	src, closeSrc, err := s.cfg.Source(ctx, s.cfg.Group, topic)
	if err != nil {
		return nil, fmt.Errorf("aspubsub: subscribe %s: %w", topic, err)
	}
	out := make(chan *message.Message)
	sctx, cancel := context.WithCancel(ctx)
	h := &handOver{out: out, done: sctx.Done(), ctx: sctx}
	c, err := inbox.NewConsumer(s.db, src, h, &inbox.Config{
		Name: s.cfg.Group + "/" + topic, Schema: s.cfg.Schema, Ordered: true, Concurrency: 1, BatchSize: 1,
		MinBackoff: s.cfg.MinBackoff, MaxBackoff: s.cfg.MaxBackoff, MaxAttempts: s.cfg.MaxAttempts, Logger: s.log,
	})
	if err != nil {
		cancel()
		closeSrc()
		return nil, fmt.Errorf("aspubsub: subscribe %s: %w", topic, err)
	}
	s.subs.Add(1)
	go func() {
		defer s.subs.Done()
		select {
		case <-s.stop:
			cancel()
		case <-sctx.Done():
		}
	}()
	s.subs.Add(1)
	go func() {
		defer s.subs.Done()
		defer close(out)
		defer cancel()
		if err := c.Run(sctx); err != nil && sctx.Err() == nil {
			s.log.Error("aspubsub: consumer stopped", "topic", topic, "err", err)
		}
		closeSrc()
	}()
	return out, nil
}

// Close ends every subscription and waits for them; each output channel is
// closed. Messages handed out and not acked roll back and are delivered
// again, to this group's next subscriber.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.stop)
	}
	s.mu.Unlock()
	s.subs.Wait()
	return nil
}

// handOver is the consumer's handler: it hands each message to watermill
// and waits for its ack or nack.
type handOver struct {
	out  chan<- *message.Message
	done <-chan struct{}
	ctx  context.Context // the subscription's, for the messages' contexts
}

// errNacked rolls a nacked message's claim back.
var errNacked = errors.New("aspubsub: nacked")

// errStopped rolls back a message the subscription ended under.
var errStopped = errors.New("aspubsub: subscription ended before the message was acked")

func (h *handOver) Handle(_ context.Context, _ pgx.Tx, m *inbox.Message) error {
	uuid := m.Headers[HeaderUUID]
	if uuid == "" {
		uuid = m.ID.String()
	}
	wm := message.NewMessage(uuid, m.Payload)
	for k, v := range m.Headers {
		if k != HeaderUUID {
			wm.Metadata[k] = v
		}
	}
	mctx, cancel := context.WithCancel(h.ctx)
	defer cancel() // the message's context ends with its ack, nack or the subscription
	wm.SetContext(mctx)
	select {
	case h.out <- wm:
	case <-h.done:
		return errStopped
	}
	select {
	case <-wm.Acked():
		return nil
	case <-wm.Nacked():
		return errNacked
	case <-h.done:
		return errStopped
	}
}
