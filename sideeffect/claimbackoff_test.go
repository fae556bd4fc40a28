package sideeffect_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/sideeffect"
)

// A claim that keeps failing (the role lost its grant) is tried again after
// pauses that grow from PollInterval, doubling, to MaxBackoff and no
// further, instead of every PollInterval.
func TestDispatcherFailingClaimBacksOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	role := testenv.NewRuntimeRole(t, b.db)
	reg := prometheus.NewRegistry()
	cfg := fastConfig(b)
	cfg.Registerer = reg
	cfg.PollInterval = 10 * time.Millisecond
	cfg.MaxBackoff = 160 * time.Millisecond
	cfg.RecoverInterval = time.Hour
	d, err := sideeffect.NewDispatcher(role.Pool, b.ledger, map[string]sideeffect.Provider{"mail": sideeffect.ProviderFunc(
		func(context.Context, sideeffect.Call) (string, error) { return "ok", nil })}, cfg)
	require.NoError(t, err)

	role.Exec(t, b.db, `REVOKE UPDATE ON side_effects FROM %s`)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(rctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	// When each failed claim was counted, seen by polling the counter.
	const failures = 10
	var at []time.Time
	last := 0.0
	deadline := time.Now().Add(30 * time.Second)
	for len(at) < failures {
		require.True(t, time.Now().Before(deadline), "only %d failed claims in 30s", len(at))
		n := testenv.Metric(t, reg, "oncekit_sideeffect_statement_errors_total", "statement", "sync", "class", "42")
		for ; last < n; last++ {
			at = append(at, time.Now())
		}
		time.Sleep(time.Millisecond) // sampling a counter's changes, not waiting for a state
	}
	gaps := make([]time.Duration, len(at)-1)
	for i := range gaps {
		gaps[i] = at[i+1].Sub(at[i])
	}
	t.Logf("pauses between failed claims: %v", gaps)
	// Expected: 10ms, 20ms, 40ms, 80ms, then 160ms, each ±20 % within
	// [PollInterval, MaxBackoff], plus the statement's own time.
	// The first pauses carry the failing statement's own time, which on a
	// loaded machine is tens of milliseconds (67, 61 and 57 ms in one run):
	// the bound only tells a start at PollInterval from one at MaxBackoff,
	// which would pause at least 128 ms (160 ms less the jitter).
	first := min(gaps[0], gaps[1])
	require.Less(t, first, 100*time.Millisecond, "the first retries come after about PollInterval, not MaxBackoff")
	require.Greater(t, gaps[len(gaps)-1], 2*first, "the pauses grow")
	// A failure the sampling above sees late lengthens one pause and
	// shortens the next by as much (296 ms then 114 ms in one run): the
	// later pauses are judged two by two.
	late := gaps[4:]
	for i := range len(late) - 1 {
		require.GreaterOrEqual(t, late[i]+late[i+1], 2*120*time.Millisecond, "pauses %d and %d reach MaxBackoff (×0.8)", i+4, i+5)
	}
	// Bounded by MaxBackoff plus the statement and the machine's load (at
	// load 10 one pause measured 241 ms): a backoff that kept doubling past
	// MaxBackoff would pause 320 ms, then 640 ms.
	for i := range len(gaps) - 1 {
		require.LessOrEqual(t, gaps[i]+gaps[i+1], 4*160*time.Millisecond, "pauses %d and %d stay within MaxBackoff (+ the statement and the load)", i, i+1)
	}
}
