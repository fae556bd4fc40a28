package natsjs

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// inflight is the number of publishes a Publisher lets wait for their acks
// at once: its limit starts at MaxPending, halves when a publish times out
// unacknowledged, and grows by one at each ack, back to MaxPending.
//
// A JetStream cluster too slow to answer within AckTimeout is then sent
// less, not the same again: a relay retries a timed-out batch in full, so
// with a fixed limit a slow cluster gets as many publishes as before and
// stays slow. The limit is cut at most once per flight of publishes, as
// TCP's congestion window is: a publish times out AckTimeout after it was
// sent, so the timeouts within AckTimeout of the last cut are of publishes
// sent before it, one stall's burst, and cut nothing more. Acks double the
// limit within a flight.
//
// Places are freed by JetStream's ack and error handlers, which it calls
// for every publish it took, whether or not a caller still waits for it.
type inflight struct {
	ackTimeout time.Duration
	min, max   int64

	n     atomic.Int64 // publishes in flight
	limit atomic.Int64 // publishes allowed in flight
	// sleeping is set while a take may wait on room.
	sleeping atomic.Bool

	mu    sync.Mutex
	cutAt time.Time     // when the limit was last cut
	room  chan struct{} // closed when a place is freed while sleeping
}

// minInflight is the least the limit is cut to.
const minInflight = 16

func newInflight(maxPending int, ackTimeout time.Duration) *inflight {
	w := &inflight{ackTimeout: ackTimeout, min: int64(min(minInflight, maxPending)), max: int64(maxPending),
		room: make(chan struct{})}
	w.limit.Store(int64(maxPending))
	return w
}

// options are the JetStream context's handlers that free the places.
func (w *inflight) options() []jetstream.JetStreamOpt {
	return []jetstream.JetStreamOpt{
		jetstream.WithPublishAsyncAckHandler(func(jetstream.JetStream, *nats.Msg, *jetstream.PubAck) { w.acked() }),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) { w.failed(err) }),
	}
}

// take waits for room for one more publish until ctx ends. The caller
// gives the place back with failed when the publish is not sent; once
// sent, JetStream's handlers give it back. A place is taken without a
// lock: on the way of every message, it costs two atomic operations.
func (w *inflight) take(ctx context.Context) error {
	for {
		if w.n.Add(1) <= w.limit.Load() {
			return nil
		}
		w.n.Add(-1)
		w.mu.Lock()
		room := w.room
		w.sleeping.Store(true)
		// A place freed before sleeping was set is seen here; one freed
		// after it closes room.
		again := w.n.Load() < w.limit.Load()
		w.mu.Unlock()
		if again {
			continue
		}
		select {
		case <-room:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// acked frees the place of a publish JetStream acknowledged, and grows the
// limit by one.
func (w *inflight) acked() {
	for {
		l := w.limit.Load()
		if l >= w.max || w.limit.CompareAndSwap(l, l+1) {
			break
		}
	}
	w.free()
}

// failed frees the place of a publish that failed with err, or was not
// sent.
func (w *inflight) failed(err error) { w.failedAt(err, time.Now()) }

func (w *inflight) failedAt(err error, now time.Time) {
	if errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
		w.mu.Lock()
		if now.Sub(w.cutAt) >= w.ackTimeout {
			w.cutAt = now
			for {
				l := w.limit.Load()
				if w.limit.CompareAndSwap(l, max(l/2, w.min)) {
					break
				}
			}
		}
		w.mu.Unlock()
	}
	w.free()
}

// free frees a place and wakes the takes waiting for one.
func (w *inflight) free() {
	w.n.Add(-1)
	if !w.sleeping.Load() {
		return
	}
	w.mu.Lock()
	if w.sleeping.Load() {
		close(w.room)
		w.room = make(chan struct{})
		w.sleeping.Store(false)
	}
	w.mu.Unlock()
}

// limitNow returns the limit.
func (w *inflight) limitNow() int { return int(w.limit.Load()) }
