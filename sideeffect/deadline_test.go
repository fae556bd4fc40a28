package sideeffect

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// at returns c with its clock set to return t.
func at(c *callDeadlines, t time.Time) *callDeadlines {
	c.now = func() time.Time { return t }
	return c
}

func TestCallsOfOneWindowShareADeadline(t *testing.T) {
	t.Parallel()
	const bound = 640 * time.Millisecond // window: 10ms
	c := newCallDeadlines(context.Background(), bound)
	defer c.stop()
	t0 := time.Now()

	first := at(c, t0).context()
	dl, ok := first.Deadline()
	require.True(t, ok)
	assert.Equal(t, t0.Add(bound), dl)

	// Within the window: the same context, a deadline at most one window
	// earlier than the call's own bound, never later.
	t1 := t0.Add(9 * time.Millisecond)
	assert.Same(t, first.(any), at(c, t1).context().(any))
	assert.False(t, dl.After(t1.Add(bound)))
	assert.LessOrEqual(t, t1.Add(bound).Sub(dl), 10*time.Millisecond)

	// Past the window: a new context, while the first stays live for the
	// calls it bounds.
	t2 := t0.Add(11 * time.Millisecond)
	second := at(c, t2).context()
	assert.NotSame(t, first.(any), second.(any))
	dl2, _ := second.Deadline()
	assert.Equal(t, t2.Add(bound), dl2)
	assert.NoError(t, first.Err())
	assert.Len(t, c.retired, 1)
}

func TestSharedCallDeadlineExpires(t *testing.T) {
	t.Parallel()
	c := newCallDeadlines(context.Background(), 30*time.Millisecond)
	defer c.stop()
	ctx := at(c, time.Now()).context()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("call context never expired")
	}
	assert.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)
}

func TestStopReleasesEveryCallContext(t *testing.T) {
	t.Parallel()
	c := newCallDeadlines(context.Background(), time.Hour)
	t0 := time.Now()
	var ctxs []context.Context
	for i := range 5 {
		ctxs = append(ctxs, at(c, t0.Add(time.Duration(i)*time.Minute)).context())
	}
	assert.Len(t, c.retired, 4)
	c.stop()
	for _, ctx := range ctxs {
		assert.ErrorIs(t, ctx.Err(), context.Canceled)
	}
	assert.Empty(t, c.retired)
}

func TestExpiredRetiredContextsAreDropped(t *testing.T) {
	t.Parallel()
	c := newCallDeadlines(context.Background(), time.Second)
	defer c.stop()
	t0 := time.Now()
	for i := range 10 {
		at(c, t0.Add(time.Duration(i)*100*time.Millisecond)).context()
	}
	assert.Len(t, c.retired, 9)
	// At t0+1.45s the windows that ended by then (started at 0, 0.1, 0.2,
	// 0.3, 0.4s) are released.
	at(c, t0.Add(1450*time.Millisecond)).context()
	assert.Len(t, c.retired, 5)
	// At t0+2.5s every earlier window has ended.
	at(c, t0.Add(2500*time.Millisecond)).context()
	assert.Empty(t, c.retired)
}

// Racing callers share contexts too: at most one per window.
func TestConcurrentCallsShareContexts(t *testing.T) {
	t.Parallel()
	c := newCallDeadlines(context.Background(), time.Minute) // window: 10ms
	defer c.stop()
	var mu sync.Mutex
	seen := map[context.Context]bool{}
	var wg sync.WaitGroup
	start := time.Now()
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				ctx := c.context()
				mu.Lock()
				seen[ctx] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	windows := int(time.Since(start)/(10*time.Millisecond)) + 1
	assert.LessOrEqual(t, len(seen), windows, "3,200 calls over %d windows", windows)
}
