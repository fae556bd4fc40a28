package inbox

import "sync"

// feed hands received messages to workers. next blocks until at least one
// message is available and returns up to max of them, or false once the
// feed is closed and empty.
type feed interface {
	put(it *item)
	next(max int) ([]*item, bool)
	close()
}

// chanFeed is the shared, bounded feed of unordered mode: any worker takes
// any message, and a full feed pushes back on the receiver (and so on the
// broker) instead of hoarding messages whose ack wait is ticking.
type chanFeed chan *item

func (f chanFeed) put(it *item) { f <- it }
func (f chanFeed) close()       { close(f) }

func (f chanFeed) next(max int) ([]*item, bool) {
	it, ok := <-f
	if !ok {
		return nil, false
	}
	out := []*item{it}
	for len(out) < max {
		select {
		case it, ok := <-f:
			if !ok {
				return out, true
			}
			out = append(out, it)
		default:
			return out, true
		}
	}
	return out, true
}

// laneFeed is one lane of ordered mode. It never blocks the receiver, so a
// lane held by a message retrying in place does not stall the other lanes;
// what it can hold is bounded by the broker's MaxAckPending (the consumer
// keeps the queued messages in progress, so the broker does not redeliver
// copies of them into the lane).
type laneFeed struct {
	mu     sync.Mutex
	items  []*item
	closed bool
	ready  chan struct{} // capacity 1: "something changed"
}

func newLaneFeed() *laneFeed { return &laneFeed{ready: make(chan struct{}, 1)} }

func (l *laneFeed) signal() {
	select {
	case l.ready <- struct{}{}:
	default:
	}
}

func (l *laneFeed) put(it *item) {
	l.mu.Lock()
	l.items = append(l.items, it)
	l.mu.Unlock()
	l.signal()
}

func (l *laneFeed) close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.signal()
}

func (l *laneFeed) next(max int) ([]*item, bool) {
	for {
		l.mu.Lock()
		if n := min(max, len(l.items)); n > 0 {
			out := make([]*item, n)
			copy(out, l.items)
			l.items = l.items[n:]
			if len(l.items) == 0 {
				l.items = nil // let the backing array go
			}
			more := len(l.items) > 0
			l.mu.Unlock()
			if more {
				l.signal()
			}
			return out, true
		}
		closed := l.closed
		l.mu.Unlock()
		if closed {
			return nil, false
		}
		<-l.ready
	}
}
