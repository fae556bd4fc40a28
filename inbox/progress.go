package inbox

import (
	"context"
	"sync"
	"time"

	"github.com/oncekit/oncekit/internal/wait"
)

// progressEvery is how often the messages in hand are signalled in
// progress: a third of the source's AckWait (learnt at start), at least
// 50 ms; every second while it is unknown.
func (c *Consumer) progressEvery() time.Duration {
	if aw := time.Duration(c.ackWait.Load()); aw > 0 {
		return max(aw/3, 50*time.Millisecond)
	}
	return time.Second
}

// inHand holds the messages a consumer has received and not yet settled
// with the broker: queued for a worker, in a batch at work, or waiting to be
// retried in place. Keeping them in progress lets slow handlers, a long
// batch or a retry run past the source's AckWait without the broker
// redelivering what the consumer still holds: each copy would only wait on
// the original's uncommitted claim to end as a duplicate, or overtake its
// key's order.
type inHand struct {
	mu    sync.Mutex
	items map[*item]struct{}
}

func newInHand() *inHand { return &inHand{items: map[*item]struct{}{}} }

func (h *inHand) add(items []*item) {
	h.mu.Lock()
	for _, it := range items {
		h.items[it] = struct{}{}
	}
	h.mu.Unlock()
}

// release forgets items once they are settled with the broker (acked,
// nakked, or left to redelivery after an unknown commit).
func (h *inHand) release(items []*item) {
	h.mu.Lock()
	for _, it := range items {
		delete(h.items, it)
	}
	h.mu.Unlock()
}

// snapshot returns the items in hand and when the oldest of them was
// received (zero when there is none).
func (h *inHand) snapshot() (items []*item, oldest time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	items = make([]*item, 0, len(h.items))
	for it := range h.items {
		items = append(items, it)
		if oldest.IsZero() || it.received.Before(oldest) {
			oldest = it.received
		}
	}
	return items, oldest
}

// keepInProgress signals every message in hand in progress, every
// progressEvery, until ctx ends, and sets the in-hand gauges. A signal that races the message's ack is
// refused by the client or ignored by the broker; one that races a nak, or
// the release of a message whose commit outcome is unknown, can only move
// that message's redelivery to one AckWait later.
func (c *Consumer) keepInProgress(ctx context.Context) {
	wait.Every(ctx, c.progressEvery(), func(ctx context.Context) {
		items, oldest := c.inHand.snapshot()
		for _, it := range items {
			_ = it.d.InProgress(ctx) // a lost signal only means a redelivery, which the claim absorbs
		}
		c.m.inHand.Set(float64(len(items)))
		if oldest.IsZero() {
			c.m.oldestInHand.Set(0)
		} else {
			c.m.oldestInHand.Set(time.Since(oldest).Seconds())
		}
	})
}
