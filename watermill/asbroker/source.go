package asbroker

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/cfgerr"
)

// SourceConfig configures a Source. Only Topics is required.
type SourceConfig struct {
	// Topics the source subscribes to. Required.
	Topics []string
	// Subscriptions is how many subscriptions the source opens per topic.
	// A watermill subscriber hands out a subscription's next message only
	// once the previous one is acked or nacked, so this bounds the messages
	// in hand per topic. Per-key order holds only with 1. Defaults to 1.
	Subscriptions int
	// AckWait is the redelivery timer watermill does not keep: a delivery
	// neither acked nor nakked within AckWait of its receipt (or of its last
	// InProgress) is nacked by the source, so the broker delivers it again.
	// It is also the AckWait Limits reports, which the inbox sizes its
	// retention and its in-progress signals by: set it at least as long as
	// the broker's own redelivery delay for a dead consumer (watermill-
	// redisstream's MaxIdleTime). Defaults to 30 s.
	AckWait time.Duration
	// Duplicates is the broker's publish dedup window, reported by Limits.
	// Defaults to 0: RabbitMQ, Redis Streams, Kafka and SQS standard queues
	// do not dedup by message ID.
	Duplicates time.Duration
}

// Source is a broker.Source over any watermill message.Subscriber, with
// consumer-group semantics when the subscriber has them (a durable RabbitMQ
// queue, a Redis Streams consumer group, a Kafka consumer group): every
// process opening a Source with the same subscriber configuration shares the
// messages.
//
// Watermill has no redelivery timer and no delivery count, so the Source
// keeps them: a delivery not settled within AckWait is nacked (the broker
// delivers it again), and Attempt counts the deliveries of a message (by its
// watermill UUID, which the Publisher sets to the event ID) that reached this
// Source; after a restart it starts from 1 again, so a poison message is
// dead-lettered after at most MaxAttempts deliveries per process.
//
// Nak(delay) holds the message for delay, then nacks it: the subscription
// hands out nothing else meanwhile, which keeps per-key order. Close nacks
// every delivery in hand, so the broker hands them to another consumer at
// once; a process that dies instead leaves them to the broker (RabbitMQ
// requeues them when the connection drops, Redis Streams lets another
// consumer claim them after MaxIdleTime).
//
// The caller keeps owning the watermill subscriber and closes it after the
// Source.
type Source struct {
	cfg SourceConfig

	msgs   chan *delivery
	done   chan struct{}
	cancel context.CancelFunc
	subs   sync.WaitGroup
	close  sync.Once

	mu       sync.Mutex
	inHand   map[*delivery]struct{}
	attempts map[string]int
}

var _ broker.Source = (*Source)(nil)

// maxTracked bounds the delivery counts a Source keeps; past it they start
// over (counts are a lower bound anyway).
const maxTracked = 1 << 16

// NewSource subscribes to cfg.Topics on sub and returns a Source reading
// them. ctx bounds the subscribing only; Close ends the subscriptions.
func NewSource(ctx context.Context, sub message.Subscriber, cfg *SourceConfig) (*Source, error) {
	if sub == nil {
		return nil, fmt.Errorf("%w: subscriber is required", ErrInvalidConfig)
	}
	c := cfgerr.CopyOf(cfg)
	bad := cfgerr.For(ErrInvalidConfig, "asbroker: SourceConfig")
	if len(c.Topics) == 0 {
		return nil, bad("Topics", "required")
	}
	if err := bad.IfNegative(c, "Subscriptions", "AckWait", "Duplicates"); err != nil {
		return nil, err
	}
	c.Subscriptions = cmp.Or(c.Subscriptions, 1)
	c.AckWait = cmp.Or(c.AckWait, 30*time.Second)
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s := &Source{cfg: c, msgs: make(chan *delivery), done: make(chan struct{}), cancel: cancel,
		inHand: map[*delivery]struct{}{}, attempts: map[string]int{}}
	for _, topic := range c.Topics {
		for range c.Subscriptions {
			if err := ctx.Err(); err != nil {
				s.Close()
				return nil, err
			}
			ch, err := sub.Subscribe(sctx, topic)
			if err != nil {
				s.Close()
				return nil, fmt.Errorf("asbroker: subscribe %s: %w", topic, err)
			}
			s.subs.Add(1)
			go s.forward(topic, ch)
		}
	}
	return s, nil
}

// forward hands the messages of one subscription to Receive until the
// subscription ends; after Close it nacks them, so that the subscription
// can notice its end.
func (s *Source) forward(topic string, ch <-chan *message.Message) {
	defer s.subs.Done()
	for m := range ch {
		d := s.track(topic, m)
		select {
		case s.msgs <- d:
		case <-s.done:
			d.settle(false, 0)
		}
	}
}

func (s *Source) track(topic string, m *message.Message) *delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.attempts) >= maxTracked {
		clear(s.attempts)
	}
	s.attempts[m.UUID]++
	d := &delivery{src: s, m: m, topic: topic, attempt: s.attempts[m.UUID]}
	s.inHand[d] = struct{}{}
	d.mu.Lock()
	d.timer = time.AfterFunc(s.cfg.AckWait, func() { d.settle(false, 0) })
	d.mu.Unlock()
	return d
}

// Receive implements broker.Source.
func (s *Source) Receive(ctx context.Context, n int) ([]broker.Delivery, error) {
	select {
	case <-s.done:
		return nil, broker.ErrSourceClosed
	default:
	}
	var first *delivery
	select {
	case first = <-s.msgs:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.done:
		return nil, broker.ErrSourceClosed
	}
	out := make([]broker.Delivery, 1, max(n, 1))
	out[0] = first
	for len(out) < n {
		select {
		case d := <-s.msgs:
			out = append(out, d)
		default:
			return out, nil
		}
	}
	return out, nil
}

// Limits implements broker.Source from the configuration: AckWait,
// unlimited deliveries, and the configured dedup window.
func (s *Source) Limits(context.Context) (broker.SourceLimits, error) {
	return broker.SourceLimits{AckWait: s.cfg.AckWait, MaxDeliver: -1, Duplicates: s.cfg.Duplicates}, nil
}

// Close ends the subscriptions. Deliveries in hand and not settled are
// nacked (handed back to the broker; an Ack that comes later is ignored,
// and the redelivered copy is a duplicate for the inbox's claim), and
// delayed naks fire at once. Receive then returns broker.ErrSourceClosed.
// Close is safe to call more than once.
func (s *Source) Close() {
	s.close.Do(func() {
		close(s.done)
		s.mu.Lock()
		held := make([]*delivery, 0, len(s.inHand))
		for d := range s.inHand {
			held = append(held, d)
		}
		s.mu.Unlock()
		for _, d := range held {
			d.handBack()
		}
		s.cancel()
		s.subs.Wait()
	})
}

// delivery adapts a watermill message to broker.Delivery.
type delivery struct {
	src     *Source
	m       *message.Message
	topic   string
	attempt int

	mu      sync.Mutex
	timer   *time.Timer // the ack wait, or the delay of a nak
	settled bool        // acked or nakked: later calls are no-ops
	sent    bool        // Ack or Nack reached watermill
}

func (d *delivery) Subject() string { return d.topic }
func (d *delivery) Data() []byte    { return d.m.Payload }
func (d *delivery) Attempt() int    { return d.attempt }

func (d *delivery) Header(name string) string { return d.m.Metadata.Get(name) }

func (d *delivery) Headers() map[string][]string {
	h := make(map[string][]string, len(d.m.Metadata))
	for k, v := range d.m.Metadata {
		h[k] = []string{v}
	}
	return h
}

// Ack acks the message; the source forgets its delivery count.
func (d *delivery) Ack(context.Context) error {
	if !d.settle(true, 0) {
		return nil
	}
	d.src.mu.Lock()
	delete(d.src.attempts, d.m.UUID)
	d.src.mu.Unlock()
	return nil
}

// Nak nacks the message after delay.
func (d *delivery) Nak(_ context.Context, delay time.Duration) error {
	d.settle(false, delay)
	return nil
}

// InProgress restarts the ack wait.
func (d *delivery) InProgress(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.settled {
		d.timer.Reset(d.src.cfg.AckWait)
	}
	return nil
}

// settle acks (ack) or nacks the message, the nack after delay; it reports
// whether this call settled it.
func (d *delivery) settle(ack bool, delay time.Duration) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.settled {
		return false
	}
	d.settled = true
	d.timer.Stop()
	if !ack && delay > 0 {
		d.timer = time.AfterFunc(delay, d.handBack)
		return true
	}
	d.send(ack)
	return true
}

// handBack nacks a delivery at once: a delayed nak whose delay is cut
// short, or one not settled at Close.
func (d *delivery) handBack() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.settled = true
	if d.timer != nil {
		d.timer.Stop()
	}
	d.send(false)
}

// send passes the settlement to watermill once; d.mu is held.
func (d *delivery) send(ack bool) {
	if d.sent {
		return
	}
	d.sent = true
	d.src.mu.Lock()
	delete(d.src.inHand, d)
	d.src.mu.Unlock()
	if ack {
		d.m.Ack()
	} else {
		d.m.Nack()
	}
}
