package natsjs

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/broker"
)

var (
	_ broker.OrderedSource     = (*Source)(nil)
	_ broker.SequencedDelivery = delivery{}
)

// scanIdle is how long Scan waits for the next message of the stream
// before it gives up (the caller tries again later).
const scanIdle = 5 * time.Second

// scanSkip is how far ahead of its position the scanner reads on (instead
// of starting over) when asked for a later sequence.
const scanSkip = 4096

// scanner reads the stream's headers in order for Scan, with an ordered
// consumer (headers only, no acks, in memory) kept from one call to the
// next, so that consecutive calls read the stream once.
type scanner struct {
	mu   sync.Mutex
	cc   jetstream.ConsumeContext
	msgs chan jetstream.Msg
	stop chan struct{}
	next uint64 // the sequence it reads next; 0 when not running
}

// AckFloor implements broker.OrderedSource: the durable's ack floor, the
// stream sequence at and below which every message is acknowledged.
func (s *Source) AckFloor(ctx context.Context) (uint64, error) {
	ci, err := s.cons.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("natsjs: consumer info: %w", err)
	}
	return ci.AckFloor.Stream, nil
}

// Scan implements broker.OrderedSource. It reads the headers of the stream's
// messages on the durable's subjects from sequence from, through an
// ordered consumer of its own, until it has read past to or the stream has
// nothing more. A work-queue stream, which allows no second consumer on
// the durable's subjects, cannot be read so.
func (s *Source) Scan(ctx context.Context, from, to uint64) ([]broker.Scanned, error) {
	sc := &s.scan
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.next == 0 || from < sc.next || from-sc.next > scanSkip {
		if err := s.restartScan(ctx, from); err != nil {
			return nil, err
		}
	}
	if to < from {
		return nil, nil // the check that the stream can be read
	}
	var out []broker.Scanned
	idle := time.NewTimer(scanIdle)
	defer idle.Stop()
	for {
		select {
		case m := <-sc.msgs:
			md, err := m.Metadata()
			if err != nil {
				sc.stopLocked()
				return nil, fmt.Errorf("natsjs: scan %s: %w", s.cfg.Stream, err)
			}
			seq := md.Sequence.Stream
			sc.next = seq + 1
			if seq >= from {
				out = append(out, broker.Scanned{Sequence: seq, Headers: m.Headers()})
			}
			if seq >= to {
				return out, nil
			}
			// Nothing pending after seq, says the server the scan reads
			// from; but it may be a replica that lags the stream (one
			// catching up after a restart). Only the stream's leader can
			// tell that the stream has nothing after seq (the rest up to
			// to was deleted); otherwise read on.
			if md.NumPending == 0 {
				last, err := s.lastSeq(ctx)
				if err != nil {
					sc.stopLocked()
					return nil, err
				}
				if last <= seq {
					return out, nil
				}
			}
			idle.Reset(scanIdle)
		case <-idle.C:
			sc.stopLocked()
			return nil, fmt.Errorf("natsjs: scan %s: no message for %s while reading up to sequence %d", s.cfg.Stream, scanIdle, to)
		case <-ctx.Done():
			sc.stopLocked()
			return nil, ctx.Err()
		case <-s.done:
			sc.stopLocked()
			return nil, broker.ErrSourceClosed
		}
	}
}

// lastSeq returns the stream's last sequence, as its leader has it.
func (s *Source) lastSeq(ctx context.Context) (uint64, error) {
	st, err := s.js.Stream(ctx, s.cfg.Stream)
	if err != nil {
		return 0, fmt.Errorf("natsjs: scan %s: %w", s.cfg.Stream, err)
	}
	return st.CachedInfo().State.LastSeq, nil
}

func (s *Source) restartScan(ctx context.Context, from uint64) error {
	sc := &s.scan
	sc.stopLocked()
	oc, err := s.js.OrderedConsumer(ctx, s.cfg.Stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: s.cfg.FilterSubjects,
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    from,
		HeadersOnly:    true,
	})
	if err != nil {
		return fmt.Errorf("natsjs: scan %s: %w", s.cfg.Stream, err)
	}
	msgs, stop := make(chan jetstream.Msg, s.cfg.Prefetch), make(chan struct{})
	cc, err := oc.Consume(func(m jetstream.Msg) {
		select {
		case msgs <- m:
		case <-stop:
		}
	})
	if err != nil {
		return fmt.Errorf("natsjs: scan %s: %w", s.cfg.Stream, err)
	}
	sc.cc, sc.msgs, sc.stop, sc.next = cc, msgs, stop, from
	return nil
}

func (sc *scanner) stopLocked() {
	if sc.cc == nil {
		return
	}
	close(sc.stop)
	sc.cc.Stop()
	sc.cc, sc.msgs, sc.stop, sc.next = nil, nil, nil, 0
}

// Sequence implements broker.SequencedDelivery: the message's stream
// sequence and the delivery's consumer sequence.
func (d delivery) Sequence() (msg, delivery uint64) {
	md, err := d.m.Metadata()
	if err != nil {
		return 0, 0
	}
	return md.Sequence.Stream, md.Sequence.Consumer
}
