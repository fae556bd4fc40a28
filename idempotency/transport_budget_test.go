package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
)

// try sends one POST through tr and returns its status (0 for an error)
// and error.
func try(t *testing.T, tr *idempotency.Transport, ctx context.Context, url string) (int, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"amount":100}`))
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// The retries of all of a Transport's requests share one budget: a server
// that keeps answering 503 gets RetryBudget retries in all, not
// MaxAttempts per request; answered requests earn retries back
// (RetryRefill each); a lost answer with no token left is an error
// wrapping ErrRetryBudgetExhausted.
func TestTransportSpendsOneRetryBudgetAcrossRequests(t *testing.T) {
	t.Parallel()
	var mode atomic.Int32 // 0: 503, 1: 201, 2: drop the connection
	srv, log := scripted(t, func(_ int, w http.ResponseWriter) bool {
		switch mode.Load() {
		case 1:
			w.WriteHeader(http.StatusCreated)
		case 2:
			return false
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		return true
	})
	attempts := func() int { log.mu.Lock(); defer log.mu.Unlock(); return len(log.keys) }
	tr := &idempotency.Transport{MaxAttempts: 10, MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond,
		RetryBudget: 5, BreakerThreshold: -1}
	ctx := context.Background()
	for range 4 {
		status, err := try(t, tr, ctx, srv.URL)
		require.NoError(t, err)
		require.Equal(t, http.StatusServiceUnavailable, status)
	}
	require.Equal(t, 4+5, attempts(), "4 first attempts and the budget's 5 retries, not 4×10 attempts")

	mode.Store(1)
	for range 6 { // 6 × 0.2: one retry earned back
		status, err := try(t, tr, ctx, srv.URL)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, status)
	}
	mode.Store(0)
	before := attempts()
	status, err := try(t, tr, ctx, srv.URL)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, status)
	require.Equal(t, 2, attempts()-before, "one retry earned back by the answered requests")

	mode.Store(2)
	_, err = try(t, tr, ctx, srv.URL)
	require.ErrorIs(t, err, idempotency.ErrRetryBudgetExhausted)

	// Without a budget (negative), each request has its MaxAttempts.
	unbounded := &idempotency.Transport{MaxAttempts: 3, MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond,
		RetryBudget: -1, BreakerThreshold: -1}
	mode.Store(0)
	before = attempts()
	for range 3 {
		_, err := try(t, unbounded, ctx, srv.URL)
		require.NoError(t, err)
	}
	require.Equal(t, 9, attempts()-before)
}

// A server that keeps failing opens the breaker: the request that met the
// BreakerThreshold-th failure in a row stops retrying, the next requests
// fail at once with ErrCircuitOpen and send nothing, then one request
// probes after the cooldown; a failed probe opens the breaker for twice
// as long, an answered one closes it.
func TestTransportBacksOffLikeACircuitBreaker(t *testing.T) {
	t.Parallel()
	var healthy atomic.Bool
	srv, log := scripted(t, func(_ int, w http.ResponseWriter) bool {
		if healthy.Load() {
			w.WriteHeader(http.StatusCreated)
		} else {
			w.WriteHeader(http.StatusBadGateway)
		}
		return true
	})
	attempts := func() int { log.mu.Lock(); defer log.mu.Unlock(); return len(log.keys) }
	const cooldown = 100 * time.Millisecond
	tr := &idempotency.Transport{MaxAttempts: 10, MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond,
		RetryBudget: -1, BreakerThreshold: 3, BreakerCooldown: cooldown}
	ctx := context.Background()
	status, err := try(t, tr, ctx, srv.URL)
	require.NoError(t, err)
	require.Equal(t, http.StatusBadGateway, status)
	opened := time.Now()
	require.Equal(t, 3, attempts(), "the third failure in a row opens the breaker: no more retries")
	for range 5 {
		_, err := try(t, tr, ctx, srv.URL)
		require.ErrorIs(t, err, idempotency.ErrCircuitOpen)
	}
	require.Equal(t, 3, attempts(), "an open breaker sends nothing")

	// After the cooldown, one probe; it fails: open again, for 2×cooldown.
	var probeAt time.Time
	require.Eventually(t, func() bool {
		_, err := try(t, tr, ctx, srv.URL)
		probeAt = time.Now()
		return !errors.Is(err, idempotency.ErrCircuitOpen)
	}, 5*time.Second, 5*time.Millisecond)
	require.GreaterOrEqual(t, probeAt.Sub(opened), cooldown)
	require.Equal(t, 4, attempts(), "one probe, not retried")

	healthy.Store(true)
	var closedAt time.Time
	require.Eventually(t, func() bool {
		status, err := try(t, tr, ctx, srv.URL)
		closedAt = time.Now()
		return err == nil && status == http.StatusCreated
	}, 5*time.Second, 5*time.Millisecond)
	require.GreaterOrEqual(t, closedAt.Sub(probeAt), 2*cooldown, "a failed probe doubles the cooldown")
	require.Equal(t, 5, attempts())
	for range 3 {
		status, err := try(t, tr, ctx, srv.URL)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, status)
	}
	require.Equal(t, 8, attempts(), "closed again")
}

// A retry that could not start before the request's context deadline is
// not waited for: the request returns its last answer at once, instead of
// sleeping into the deadline and returning only its error.
func TestTransportStopsAtTheContextDeadline(t *testing.T) {
	t.Parallel()
	srv, log := scripted(t, func(_ int, w http.ResponseWriter) bool {
		w.Header().Set("Retry-After", "10")
		w.WriteHeader(http.StatusServiceUnavailable)
		return true
	})
	tr := &idempotency.Transport{MaxAttempts: 100, RetryBudget: -1, BreakerThreshold: -1}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	status, err := try(t, tr, ctx, srv.URL)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, status, "the last answer, not the deadline's error")
	require.Less(t, time.Since(start), 2*time.Second, "returned without waiting for the deadline")
	require.Len(t, log.keys, 1)

	// Backoff shorter than the deadline: retried until the next wait
	// would pass it, then the last answer.
	fast, flog := scripted(t, func(_ int, w http.ResponseWriter) bool {
		w.WriteHeader(http.StatusServiceUnavailable)
		return true
	})
	tr = &idempotency.Transport{MaxAttempts: 1000, MinBackoff: 20 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		RetryBudget: -1, BreakerThreshold: -1}
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start = time.Now()
	status, err = try(t, tr, ctx, fast.URL)
	if err != nil {
		require.ErrorIs(t, err, context.DeadlineExceeded)
	} else {
		require.Equal(t, http.StatusServiceUnavailable, status)
	}
	require.Less(t, time.Since(start), 300*time.Millisecond+time.Second, "no wait past the deadline (with room for a loaded machine)")
	flog.mu.Lock()
	defer flog.mu.Unlock()
	require.Greater(t, len(flog.keys), 1)
	require.Less(t, len(flog.keys), 1000)
}
