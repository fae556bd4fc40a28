package sideeffect

import (
	"context"
	"sync"
	"time"
)

// callDeadlines hands out the contexts that bound one kind's calls. The
// calls that start within one window share a context, and so one timer. A
// context of its own per call (its timer, its cancel state, and the child
// contexts net/http registers in it for each request) cost about 3 µs of
// CPU per call, 7% of a local webhook call.
//
// A call's deadline is never later than its start plus the bound, and at
// most one window earlier: the window is 1/64 of the bound, at most 10ms.
type callDeadlines struct {
	parent        context.Context // not cancelled by shutdown (see work)
	bound, window time.Duration
	now           func() time.Time // read under mu, so windows open in time order

	mu     sync.Mutex
	ctx    context.Context // shared by the calls of the current window
	end    time.Time       // ctx's deadline
	cancel context.CancelFunc
	// retired are the earlier windows' cancel functions, oldest first,
	// kept until their deadlines pass (their calls may still run) and
	// called by stop.
	retired []retiredDeadline
}

type retiredDeadline struct {
	end    time.Time
	cancel context.CancelFunc
}

func newCallDeadlines(parent context.Context, bound time.Duration) *callDeadlines {
	return &callDeadlines{parent: parent, bound: bound, window: min(bound/64, 10*time.Millisecond), now: time.Now}
}

// context returns the context for a call starting now.
func (c *callDeadlines) context() context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	latest := now.Add(c.bound)
	if c.ctx != nil && !c.end.After(latest) && latest.Sub(c.end) <= c.window {
		return c.ctx
	}
	if c.ctx != nil {
		c.retired = append(c.retired, retiredDeadline{c.end, c.cancel})
		n := 0
		for n < len(c.retired) && c.retired[n].end.Before(now) {
			c.retired[n].cancel() // expired already: this only lets go of it
			n++
		}
		c.retired = c.retired[n:]
	}
	c.ctx, c.cancel = context.WithDeadline(c.parent, latest)
	c.end = latest
	return c.ctx
}

// stop releases every context handed out; the calls bounded by them must
// have returned.
func (c *callDeadlines) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.retired {
		r.cancel()
	}
	c.retired = nil
	if c.cancel != nil {
		c.cancel()
		c.ctx, c.cancel = nil, nil
	}
}
