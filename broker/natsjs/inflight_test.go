package natsjs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// The limit is cut once per flight: the timeouts within AckTimeout of the
// last cut, of publishes sent before it (one stall's burst), cut nothing
// more; a timeout after that cuts again, down to the floor; acks grow it
// back by one each, up to MaxPending; other errors leave it.
func TestInflightCutsOncePerFlight(t *testing.T) {
	const ackTimeout = time.Second
	w := newInflight(64, ackTimeout)
	ctx := context.Background()
	for range 64 {
		require.NoError(t, w.take(ctx))
	}
	full, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	err := w.take(full)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "a 65th publish was let through a limit of 64")

	t0 := time.Now()
	for i := range 64 {
		w.failedAt(jetstream.ErrAsyncPublishTimeout, t0.Add(time.Duration(i)*time.Millisecond))
	}
	require.Equal(t, 32, w.limitNow(), "64 timeouts of one flight")

	for range 32 {
		require.NoError(t, w.take(ctx))
	}
	next := t0.Add(ackTimeout)
	w.failedAt(jetstream.ErrAsyncPublishTimeout, next)
	require.Equal(t, 16, w.limitNow(), "a timeout of the next flight")
	w.failedAt(jetstream.ErrAsyncPublishTimeout, next.Add(time.Millisecond))
	require.Equal(t, 16, w.limitNow(), "a second timeout of that flight")
	w.failedAt(jetstream.ErrAsyncPublishTimeout, next.Add(2*ackTimeout))
	require.Equal(t, 16, w.limitNow(), "a timeout at the floor")
	w.failedAt(errors.New("nats: no responders"), next.Add(3*ackTimeout))
	require.Equal(t, 16, w.limitNow(), "an error other than a timeout")

	for range 32 - 4 {
		w.acked()
	}
	require.Equal(t, 16+28, w.limitNow(), "28 acks")
	for range 100 {
		require.NoError(t, w.take(ctx))
		w.acked()
	}
	require.Equal(t, 64, w.limitNow(), "acks grow the limit back to MaxPending, no further")
	require.Zero(t, w.n.Load())
}

// A take waiting for room gets it when a place is freed, before its ctx
// ends.
func TestInflightWaiterGetsAFreedPlace(t *testing.T) {
	w := newInflight(1, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, w.take(ctx))
	got := make(chan error, 1)
	go func() { got <- w.take(ctx) }()
	select {
	case err := <-got:
		t.Fatalf("a second publish got the only place: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	w.failed(errors.New("nats: connection closed"))
	require.NoError(t, <-got)
}
