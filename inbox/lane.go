package inbox

import (
	"slices"
	"sync"
	"time"

	"github.com/oncekit/oncekit/internal/backoff"
)

// Holding back: the first wait, doubled at each hold of the same delivery
// up to the last. The wait ends early when this process settles a message
// of the key; the rest polls the database for another process's commit.
const (
	holdFirst = 5 * time.Millisecond
	holdMax   = 200 * time.Millisecond
)

var holdBackoff = backoff.Policy{Min: holdFirst, Max: holdMax}

// heldLong is how long a message waits behind an earlier one of its key
// before the consumer says so in its log (and again at this interval).
const heldLong = 30 * time.Second

// orderedLane is one lane of ordered mode: its messages in sequence order
// (a redelivery goes back before the later messages that overtook it). A
// message held back waits in place until its time, and the later messages
// of its key wait behind it; the other keys of the lane go on. It never
// blocks the receiver, so a lane held by a message retrying in place does
// not stall the other lanes; what it can hold is bounded by the broker's
// MaxAckPending (the consumer keeps the queued messages in progress, so the
// broker does not redeliver copies of them into the lane).
type orderedLane struct {
	mu     sync.Mutex
	items  []*item // by sequence
	closed bool
	ready  chan struct{} // capacity 1: "something changed"
}

func newOrderedLane() *orderedLane { return &orderedLane{ready: make(chan struct{}, 1)} }

func (l *orderedLane) signal() {
	select {
	case l.ready <- struct{}{}:
	default:
	}
}

func (l *orderedLane) put(it *item) {
	l.mu.Lock()
	l.insertLocked(it)
	l.mu.Unlock()
	l.signal()
}

func (l *orderedLane) insertLocked(it *item) {
	i, _ := slices.BinarySearchFunc(l.items, it.seq, func(x *item, seq uint64) int {
		switch {
		case x.seq < seq:
			return -1
		case x.seq > seq:
			return 1
		}
		return 0
	})
	// After the items of the same sequence: a copy keeps arrival order.
	for i < len(l.items) && l.items[i].seq == it.seq {
		i++
	}
	l.items = slices.Insert(l.items, i, it)
}

// hold puts items back to wait, each longer than the last time it waited.
func (l *orderedLane) hold(items []*item) {
	if len(items) == 0 {
		return
	}
	now := time.Now()
	l.mu.Lock()
	for _, it := range items {
		it.holds++
		it.notBefore = now.Add(holdBackoff.Delay(it.holds))
		l.insertLocked(it)
	}
	l.mu.Unlock()
	l.signal()
}

// wake ends the wait of the held messages of keys.
func (l *orderedLane) wake(keys map[string]bool) {
	if len(keys) == 0 {
		return
	}
	l.mu.Lock()
	woke := false
	for _, it := range l.items {
		if !it.notBefore.IsZero() && keys[it.key] {
			it.notBefore, woke = time.Time{}, true
		}
	}
	l.mu.Unlock()
	if woke {
		l.signal()
	}
}

func (l *orderedLane) close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.signal()
}

// next returns up to max messages in sequence order, skipping a held
// message whose wait is not over and the later messages of its key. Once
// the lane is closed it returns what is left, held or not.
func (l *orderedLane) next(max int) ([]*item, bool) {
	for {
		l.mu.Lock()
		out, wake := l.takeLocked(max, time.Now())
		closed := l.closed
		l.mu.Unlock()
		if len(out) > 0 {
			return out, true
		}
		if closed {
			return nil, false
		}
		if wake.IsZero() {
			<-l.ready
			continue
		}
		timer := time.NewTimer(time.Until(wake))
		select {
		case <-l.ready:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// takeLocked removes and returns the messages next may return, and the
// earliest end of a wait it skipped (zero: none).
func (l *orderedLane) takeLocked(max int, now time.Time) (out []*item, wake time.Time) {
	if len(l.items) == 0 {
		return nil, time.Time{}
	}
	var blocked map[string]bool
	rest := l.items[:0]
	for _, it := range l.items {
		switch {
		case len(out) == max:
		case l.closed:
			out = append(out, it)
			continue
		case it.key != "" && blocked[it.key]:
		case it.notBefore.After(now):
			if it.key != "" {
				if blocked == nil {
					blocked = map[string]bool{}
				}
				blocked[it.key] = true
			}
			if wake.IsZero() || it.notBefore.Before(wake) {
				wake = it.notBefore
			}
		default:
			it.notBefore = time.Time{}
			out = append(out, it)
			continue
		}
		rest = append(rest, it)
	}
	clear(l.items[len(rest):])
	l.items = rest
	if len(l.items) == 0 {
		l.items = nil // let the backing array go
	} else if len(out) > 0 {
		l.signal() // more may be ready for the next call
	}
	return out, wake
}

// warnHeldLong logs the held messages that have waited heldLong behind an
// earlier message of their key, naming the one they wait on: an ordered
// consumer that stops making progress says why.
func (c *Consumer) warnHeldLong(held []*item) {
	now := time.Now()
	for _, it := range held {
		if it.heldSince.IsZero() {
			it.heldSince = now
		}
		if now.Sub(it.heldSince) < heldLong || now.Sub(it.warnedAt) < heldLong {
			continue
		}
		it.warnedAt = now
		c.log.Warn("inbox ordered: message held back behind an earlier message of its key",
			"seq", it.seq, "key", it.key, "held_for", now.Sub(it.heldSince).Round(time.Second),
			"waits_on", c.gate.firstPending(it.key), "holds", it.holds)
	}
}
