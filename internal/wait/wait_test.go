package wait

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestSleepElapses(t *testing.T) {
	t.Parallel()
	start := time.Now()
	assert.True(t, Sleep(context.Background(), 20*time.Millisecond))
	assert.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond)
}

func TestSleepEndsWithTheContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	assert.False(t, Sleep(ctx, time.Hour))
	assert.Less(t, time.Since(start), 10*time.Second)
}

func TestUntilReturnsOnceCheckPasses(t *testing.T) {
	t.Parallel()
	calls := 0
	err := Until(context.Background(), time.Millisecond, func(context.Context) error {
		calls++
		if calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	assert.NoError(t, err)
	assert.Equal(t, 3, calls)
}

func TestUntilEndsWithTheContextAndTheLastError(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := Until(ctx, time.Millisecond, func(context.Context) error { return errors.New("still down") })
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorContains(t, err, "still down")
}

func TestClosed(t *testing.T) {
	t.Parallel()
	ch := make(chan struct{})
	assert.False(t, Closed(ch))
	close(ch)
	assert.True(t, Closed(ch))
}

func TestEveryStepsAtOnceThenEachIntervalUntilTheContextEnds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	steps := make(chan time.Time, 16)
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		Every(ctx, 20*time.Millisecond, func(context.Context) { steps <- time.Now() })
	}()
	first := <-steps
	if d := first.Sub(start); d >= 20*time.Millisecond {
		t.Fatalf("first step after %v, want at once", d)
	}
	<-steps // the second
	third := <-steps
	if d := third.Sub(first); d < 35*time.Millisecond {
		t.Fatalf("third step %v after the first, want two intervals", d)
	}
	cancel()
	<-done // Every returned
}
