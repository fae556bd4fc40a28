package natsjs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/cfgerr"
)

// SourceConfig configures a Source: the durable pull consumer it creates (or
// updates) on the stream. Only Stream and Durable are required.
type SourceConfig struct {
	// Stream the consumer reads. Required.
	Stream string
	// Durable is the consumer's name; processes using the same name share
	// its messages. Required.
	Durable string
	// FilterSubjects restricts the consumer to these subjects. Defaults to
	// every subject of the stream.
	FilterSubjects []string
	// AckWait is how long JetStream waits for an ack before redelivering.
	// Defaults to 30 s.
	AckWait time.Duration
	// MaxDeliver bounds deliveries per message. Defaults to -1 (unlimited):
	// the inbox dead-letters after its MaxAttempts, so a message is never
	// silently dropped by the broker.
	MaxDeliver int
	// MaxAckPending bounds the messages delivered and not yet acked across
	// every process of the durable. Defaults to 2048.
	MaxAckPending int
	// Prefetch is how many messages the Source asks JetStream for at once;
	// it asks again when half of them have come. What JetStream delivers
	// ahead of the consumer is held, and kept in progress so that it is not
	// redelivered meanwhile, however slow the consumer: MaxAckPending
	// bounds it. Defaults to 512.
	Prefetch int
	// DeliverPolicy is where a newly created durable starts. It applies only
	// when NewSource creates the durable; JetStream refuses to change it on an
	// existing one. Defaults to jetstream.DeliverAllPolicy (the whole stream).
	DeliverPolicy jetstream.DeliverPolicy
	// MustExist makes NewSource fail with ErrDurableNotFound instead of
	// creating a missing durable. A durable lost after deployment (deleted by
	// hand, or the stream recreated) would otherwise be created anew and
	// deliver the stream again from DeliverPolicy, and messages whose claims
	// are past the consumer's Retention would be processed again. Production
	// processes should set it, and create the durable once at deployment.
	// Defaults to false.
	MustExist bool
}

// ErrDurableNotFound is returned by NewSource with MustExist when the durable
// does not exist.
var ErrDurableNotFound = errors.New("natsjs: durable consumer not found")

// Source is an broker.Source over a JetStream durable pull consumer with
// explicit acks. It is safe for concurrent use; Close stops it.
type Source struct {
	js   jetstream.JetStream
	cons jetstream.Consumer
	cfg  SourceConfig

	start    sync.Once
	startErr error
	cc       jetstream.ConsumeContext
	done     chan struct{}
	close    sync.Once
	keeper   sync.WaitGroup // keepHeld, until Close

	// held are the messages JetStream delivered and Receive has not yet
	// handed out, in delivery order; ready signals that there are some.
	// Once closed, a message delivered is handed back at once.
	mu     sync.Mutex
	held   []jetstream.Msg
	closed bool
	ready  chan struct{}

	// ended is closed once JetStream ended the subscription for good (the
	// consumer was deleted); endErr says why.
	ended  chan struct{}
	endErr error
	end    sync.Once

	scan scanner // ordered mode's reader of the stream (Scan)
}

var (
	_ broker.Source     = (*Source)(nil)
	_ broker.Terminator = delivery{}
)

// NewSource creates or updates the durable consumer and returns a Source
// reading it. Messages are fetched from the first Receive on.
func NewSource(ctx context.Context, js jetstream.JetStream, cfg *SourceConfig) (*Source, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: NewSource: nil JetStream", ErrInvalidConfig)
	}
	c := cfgerr.CopyOf(cfg)
	bad := cfgerr.For(ErrInvalidConfig, "natsjs: SourceConfig")
	switch {
	case c.Stream == "":
		return nil, bad("Stream", "required")
	case c.Durable == "":
		return nil, bad("Durable", "required")
	}
	if err := bad.IfNegative(c, "AckWait", "MaxAckPending", "Prefetch"); err != nil {
		return nil, err
	}
	c.AckWait = cmp.Or(c.AckWait, 30*time.Second)
	c.MaxDeliver = cmp.Or(c.MaxDeliver, -1)
	c.MaxAckPending = cmp.Or(c.MaxAckPending, 2048)
	c.Prefetch = cmp.Or(c.Prefetch, 512)
	cc := jetstream.ConsumerConfig{
		Durable:       c.Durable,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    c.MaxDeliver,
		MaxAckPending: c.MaxAckPending,
		DeliverPolicy: c.DeliverPolicy,
	}
	// One subject goes in FilterSubject, which servers before 2.10 (without
	// FilterSubjects) understand too.
	if len(c.FilterSubjects) == 1 {
		cc.FilterSubject = c.FilterSubjects[0]
	} else {
		cc.FilterSubjects = c.FilterSubjects
	}
	if c.MustExist {
		existing, err := js.Consumer(ctx, c.Stream, c.Durable)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, fmt.Errorf("%w: %s on %s", ErrDurableNotFound, c.Durable, c.Stream)
		}
		if err != nil {
			return nil, fmt.Errorf("natsjs: consumer %s on %s: %w", c.Durable, c.Stream, err)
		}
		// An existing durable keeps its start position: the server refuses
		// to change it.
		was := existing.CachedInfo().Config
		cc.DeliverPolicy, cc.OptStartSeq, cc.OptStartTime = was.DeliverPolicy, was.OptStartSeq, was.OptStartTime
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, c.Stream, cc)
	if err != nil {
		return nil, fmt.Errorf("natsjs: consumer %s on %s: %w", c.Durable, c.Stream, err)
	}
	return &Source{js: js, cons: cons, cfg: c, done: make(chan struct{}), ready: make(chan struct{}, 1),
		ended: make(chan struct{})}, nil
}

// consumeErr notes the errors after which JetStream stops the subscription
// (the consumer was deleted, or the pull request was refused), so that
// Receive reports them instead of waiting forever. Other errors (missed
// heartbeats, leadership changes) are recovered by the client.
func (s *Source) consumeErr(_ jetstream.ConsumeContext, err error) {
	if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrBadRequest) {
		s.end.Do(func() {
			s.endErr = err
			close(s.ended)
		})
	}
}

func (s *Source) consume() error {
	s.start.Do(func() {
		s.cc, s.startErr = s.cons.Consume(s.hold, jetstream.PullMaxMessages(s.cfg.Prefetch),
			jetstream.ConsumeErrHandler(s.consumeErr))
		if s.startErr == nil {
			s.keeper.Go(s.keepHeld)
		}
	})
	return s.startErr
}

// hold is the subscription's callback: it keeps m for Receive, or hands it
// back at once once the Source is closed. It never blocks, so that every
// message the client has is one the Source keeps in progress (keepHeld):
// a callback that blocked would leave the client's own buffer behind it to
// JetStream's redelivery.
func (s *Source) hold(m jetstream.Msg) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = m.Nak()
		return
	}
	s.held = append(s.held, m)
	s.mu.Unlock()
	s.signal()
}

// signal tells a Receive waiting on ready that messages are held.
func (s *Source) signal() {
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// keepHeld signals the held messages in progress every third of AckWait
// until Close, or until the subscription ends (its connection closed). It
// signals under the lock, so that no message is handed out (and perhaps
// already settled) between the snapshot and its signal.
func (s *Source) keepHeld() {
	ended := s.cc.Closed()
	t := time.NewTicker(max(s.cfg.AckWait/3, 50*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-ended:
			return
		case <-t.C:
		}
		s.mu.Lock()
		for _, m := range s.held {
			_ = m.InProgress() // a lost signal only means a redelivery, which the inbox's claim absorbs
		}
		s.mu.Unlock()
	}
}

// Receive implements broker.Source. Once JetStream has ended the
// subscription for good (the durable consumer was deleted), Receive returns
// that error (jetstream.ErrConsumerDeleted) after the messages already
// held; a new Source recreates the consumer.
func (s *Source) Receive(ctx context.Context, max int) ([]broker.Delivery, error) {
	if err := s.consume(); err != nil {
		return nil, fmt.Errorf("natsjs: consume %s: %w", s.cfg.Durable, err)
	}
	for {
		if out := s.take(max); out != nil {
			return out, nil
		}
		select {
		case <-s.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.done:
			return nil, broker.ErrSourceClosed
		case <-s.ended:
			if out := s.take(max); out != nil {
				return out, nil
			}
			return nil, fmt.Errorf("natsjs: consume %s: %w", s.cfg.Durable, s.endErr)
		}
	}
}

// take hands out up to max held messages, the oldest first; nil if none.
func (s *Source) take(max int) []broker.Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.held) == 0 || s.closed {
		return nil
	}
	n := min(max, len(s.held))
	out := make([]broker.Delivery, n)
	for i, m := range s.held[:n] {
		out[i] = delivery{m}
	}
	clear(s.held[:n]) // append moves what is left once the array is used up
	s.held = s.held[n:]
	if len(s.held) > 0 {
		s.signal()
	}
	return out
}

// Limits implements broker.Source from the consumer's and the stream's
// current configuration.
func (s *Source) Limits(ctx context.Context) (broker.SourceLimits, error) {
	ci, err := s.cons.Info(ctx)
	if err != nil {
		return broker.SourceLimits{}, fmt.Errorf("natsjs: consumer info: %w", err)
	}
	st, err := s.js.Stream(ctx, s.cfg.Stream)
	if err != nil {
		return broker.SourceLimits{}, fmt.Errorf("natsjs: stream %s: %w", s.cfg.Stream, err)
	}
	si, err := st.Info(ctx)
	if err != nil {
		return broker.SourceLimits{}, fmt.Errorf("natsjs: stream info: %w", err)
	}
	return broker.SourceLimits{AckWait: ci.Config.AckWait, MaxDeliver: ci.Config.MaxDeliver, Duplicates: si.Config.Duplicates}, nil
}

// Close stops fetching and hands every message the Source holds back to
// JetStream, which delivers it again at once (to another process of the
// durable, say) instead of after AckWait. Messages Receive handed out are
// the caller's to settle.
func (s *Source) Close() {
	s.close.Do(func() {
		close(s.done)
		s.start.Do(func() { s.startErr = broker.ErrSourceClosed })
		s.mu.Lock()
		s.closed = true
		held := s.held
		s.held = nil
		s.mu.Unlock()
		if s.cc != nil {
			// What the client still buffers goes through hold, which
			// hands it back.
			s.cc.Drain()
		}
		for _, m := range held {
			_ = m.Nak()
		}
		s.keeper.Wait()
		s.scan.mu.Lock()
		s.scan.stopLocked()
		s.scan.mu.Unlock()
	})
}

// delivery adapts a jetstream.Msg to broker.Delivery.
type delivery struct{ m jetstream.Msg }

func (d delivery) Subject() string              { return d.m.Subject() }
func (d delivery) Data() []byte                 { return d.m.Data() }
func (d delivery) Header(name string) string    { return d.m.Headers().Get(name) }
func (d delivery) Headers() map[string][]string { return d.m.Headers() }
func (d delivery) Ack(context.Context) error    { return d.m.Ack() }
func (d delivery) InProgress(context.Context) error {
	return d.m.InProgress()
}

// Term terminates the message at the server; the reason is in the server's
// advisory ($JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED).
func (d delivery) Term(_ context.Context, reason string) error { return d.m.TermWithReason(reason) }

func (d delivery) Nak(_ context.Context, delay time.Duration) error {
	if delay <= 0 {
		return d.m.Nak()
	}
	return d.m.NakWithDelay(delay)
}

func (d delivery) Attempt() int {
	md, err := d.m.Metadata()
	if err != nil {
		return 1
	}
	return int(md.NumDelivered)
}
