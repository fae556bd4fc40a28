package backoff

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Without jitter, the wait doubles from Min per attempt and stops at Max;
// Delay and a Backoff's Next agree, and Reset starts over.
func TestDelayDoublesFromMinUpToMax(t *testing.T) {
	t.Parallel()
	p := Policy{Min: time.Second, Max: 5 * time.Minute}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second,
		32 * time.Second, 64 * time.Second, 128 * time.Second, 256 * time.Second, 5 * time.Minute, 5 * time.Minute}
	b := p.Start()
	for i, w := range want {
		require.Equal(t, w, p.Delay(i+1), "Delay(%d)", i+1)
		require.Equal(t, w, b.Next(), "Next #%d", i+1)
	}
	b.Reset()
	require.Equal(t, time.Second, b.Next())
	require.Equal(t, time.Second, p.Delay(0), "an attempt below 1 counts as 1")
	require.Equal(t, 5*time.Minute, p.Delay(1<<30), "a huge attempt is Max, without overflow")
}

// Max below Min is Min, a negative Min is 0, and the zero Policy waits
// nothing.
func TestPolicyBoundsAreConsistent(t *testing.T) {
	t.Parallel()
	require.Equal(t, 3*time.Second, Policy{Min: 3 * time.Second, Max: time.Second}.Delay(5))
	require.Equal(t, time.Duration(0), Policy{Min: -time.Second}.Delay(3))
	require.Equal(t, time.Duration(0), Policy{}.Start().Next())
	require.Equal(t, time.Duration(0), Policy{Max: time.Second}.Delay(1<<30), "no growth from 0, at once")
	require.Equal(t, 10*time.Millisecond, Policy{Min: 10 * time.Millisecond, Max: 10 * time.Millisecond, Jitter: 0.5}.Delay(1000))
}

// Jitter spreads each wait over ±Jitter around its un-jittered value, and
// never outside [Min, Max]: across many draws both ends of the spread are
// reached and the values differ.
func TestJitterSpreadsWithinBounds(t *testing.T) {
	t.Parallel()
	p := Policy{Min: 100 * time.Millisecond, Max: 1600 * time.Millisecond, Jitter: 0.2}
	for attempt := 1; attempt <= 8; attempt++ {
		base := Policy{Min: p.Min, Max: p.Max}.Delay(attempt)
		lo := max(time.Duration(float64(base)*0.8), p.Min)
		hi := min(time.Duration(float64(base)*1.2), p.Max)
		seen := map[time.Duration]bool{}
		minSeen, maxSeen := hi, lo
		for range 2000 {
			d := p.Delay(attempt)
			require.GreaterOrEqual(t, d, lo, "attempt %d", attempt)
			require.LessOrEqual(t, d, hi, "attempt %d", attempt)
			seen[d] = true
			minSeen, maxSeen = min(minSeen, d), max(maxSeen, d)
		}
		require.Greater(t, len(seen), 100, "attempt %d: jitter draws distinct waits", attempt)
		// The draws reach within 5 % of each end of the allowed range.
		slack := (hi - lo) / 20
		require.LessOrEqual(t, minSeen, lo+slack, "attempt %d: low end of [%v, %v]", attempt, lo, hi)
		require.GreaterOrEqual(t, maxSeen, hi-slack, "attempt %d: high end of [%v, %v]", attempt, lo, hi)
		t.Logf("attempt %d: base %v, drawn %v..%v (allowed %v..%v)", attempt, base, minSeen, maxSeen, lo, hi)
	}
}

// Full jitter draws from [0, d]: waits below Min occur, none above the
// un-jittered wait.
func TestFullJitterDrawsFromZero(t *testing.T) {
	t.Parallel()
	p := Policy{Min: 100 * time.Millisecond, Max: time.Second, FullJitter: true}
	var below bool
	for range 1000 {
		d := p.Delay(3)
		require.GreaterOrEqual(t, d, time.Duration(0))
		require.LessOrEqual(t, d, 400*time.Millisecond)
		below = below || d < p.Min
	}
	require.True(t, below, "full jitter reaches below Min")
}

// With jitter, a Backoff's waits still grow from about Min to about Max.
func TestBackoffGrowsWithJitter(t *testing.T) {
	t.Parallel()
	b := Policy{Min: 10 * time.Millisecond, Max: 640 * time.Millisecond, Jitter: 0.2}.Start()
	var got []time.Duration
	for range 10 {
		got = append(got, b.Next())
	}
	require.LessOrEqual(t, got[0], 12*time.Millisecond)
	for i := 1; i < 7; i++ {
		// Doubling beats a ±20 % spread: 2×0.8 > 1.2.
		require.Greater(t, got[i], got[i-1], "wait %d grows: %v", i, got)
	}
	require.GreaterOrEqual(t, got[9], 512*time.Millisecond)
	require.LessOrEqual(t, got[9], 640*time.Millisecond)
}

// Retry retries until success, waiting between failures as the Policy
// says and telling notify each failure and wait.
func TestRetryUntilSuccess(t *testing.T) {
	t.Parallel()
	calls := 0
	var waits []time.Duration
	err := Retry(context.Background(), Policy{Min: time.Millisecond, Max: 4 * time.Millisecond},
		func(context.Context) error {
			if calls++; calls < 5 {
				return errors.New("not yet")
			}
			return nil
		},
		func(err error, wait time.Duration) {
			require.EqualError(t, err, "not yet")
			waits = append(waits, wait)
		})
	require.NoError(t, err)
	require.Equal(t, 5, calls)
	require.Equal(t, []time.Duration{time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond, 4 * time.Millisecond}, waits)
}

// A Permanent error ends Retry at once and is returned unwrapped.
func TestRetryStopsOnPermanent(t *testing.T) {
	t.Parallel()
	errGone := errors.New("gone")
	calls := 0
	err := Retry(context.Background(), Policy{Min: time.Millisecond},
		func(context.Context) error { calls++; return Permanent(errGone) }, nil)
	require.Equal(t, errGone, err)
	require.Equal(t, 1, calls)
}

// Retry stops when ctx ends, during a wait (long as it is) or before the
// first call, and returns ctx's error.
func TestRetryStopsOnContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	failed := make(chan struct{})
	done := make(chan error, 1)
	calls := 0
	go func() {
		done <- Retry(ctx, Policy{Min: time.Hour, Max: time.Hour}, func(context.Context) error {
			calls++
			close(failed)
			return errors.New("down")
		}, nil)
	}()
	<-failed
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
		require.Less(t, time.Since(start), time.Second, "the hour-long wait ended with ctx")
	case <-time.After(10 * time.Second):
		t.Fatal("Retry did not stop when ctx ended")
	}
	require.Equal(t, 1, calls)

	err := Retry(ctx, Policy{}, func(context.Context) error { t.Fatal("called after ctx ended"); return nil }, nil)
	require.ErrorIs(t, err, context.Canceled)
}
