package inbox

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
