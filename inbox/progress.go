package inbox

import (
	"context"
	"sync"
	"time"
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

func (h *inHand) snapshot() []*item {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*item, 0, len(h.items))
	for it := range h.items {
		out = append(out, it)
	}
	return out
}

// keepInProgress signals every message in hand in progress, every
// progressEvery, until ctx ends. A signal that races the message's ack is
// refused by the client or ignored by the broker; one that races a nak, or
// the release of a message whose commit outcome is unknown, can only move
// that message's redelivery to one AckWait later.
func (c *Consumer) keepInProgress(ctx context.Context) {
	tick := time.NewTicker(c.progressEvery())
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			for _, it := range c.inHand.snapshot() {
				_ = it.d.InProgress(ctx) // a lost signal only means a redelivery, which the claim absorbs
			}
		}
	}
}
