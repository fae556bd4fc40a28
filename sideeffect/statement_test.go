package sideeffect_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/sideeffect"
)

// A dispatcher whose role lost its grant on side_effects logs one error
// for the cause, not one per round, counts it and reports it by Healthy,
// calls nothing it could not claim, and once the grant is back calls every
// effect once.
func TestDispatcherStatementRefusedIsAnErrorCountedAndUnhealthy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	role := testenv.NewRuntimeRole(t, b.db)

	var mu sync.Mutex
	calls := map[string]int{}
	provider := sideeffect.ProviderFunc(func(_ context.Context, c sideeffect.Call) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		calls[c.Key]++
		return "ok", nil
	})
	var logs testenv.SyncBuffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("dispatcher log:\n%s", logs.String())
		}
	})
	reg := prometheus.NewRegistry()
	cfg := fastConfig(b)
	cfg.Registerer = reg
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	d, err := sideeffect.NewDispatcher(role.Pool, b.ledger, map[string]sideeffect.Provider{"mail": provider}, cfg)
	require.NoError(t, err)
	require.NoError(t, d.Healthy(ctx))

	role.Exec(t, b.db, `REVOKE UPDATE ON side_effects FROM %s`)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(rctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	const n = 20
	keys := b.record(t, "mail", n)

	errorsTotal := func() float64 {
		return testenv.Metric(t, reg, "oncekit_sideeffect_statement_errors_total", "statement", "sync", "class", "42")
	}
	require.Eventually(t, func() bool { return errorsTotal() >= 5 && d.Healthy(ctx) != nil },
		30*time.Second, 10*time.Millisecond, "errors %v, healthy %v", errorsTotal(), d.Healthy(ctx))
	herr := d.Healthy(ctx)
	require.ErrorIs(t, herr, oncekit.ErrStatementBroken)
	require.Contains(t, herr.Error(), "permission denied for table side_effects")
	t.Logf("Healthy: %v", herr)
	t.Logf("oncekit_sideeffect_statement_errors_total{statement=sync,class=42} = %v", errorsTotal())
	out := logs.String()
	require.Equal(t, 1, strings.Count(out, "statement=sync class=42"), "one error line for the cause, however many rounds:\n%s", out)
	require.NotContains(t, out, `msg="claim failed"`, "no error line per round")
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "level=ERROR") {
			t.Logf("log: %s", l)
		}
	}
	mu.Lock()
	require.Empty(t, calls, "nothing called without its claim")
	mu.Unlock()

	role.Exec(t, b.db, `GRANT UPDATE ON side_effects TO %s`)
	b.waitState(t, sideeffect.StateConfirmed, n, 30*time.Second)
	mu.Lock()
	require.Len(t, calls, n)
	for _, k := range keys {
		require.Equal(t, 1, calls[k], k)
	}
	mu.Unlock()
	require.Eventually(t, func() bool { return d.Healthy(ctx) == nil }, 10*time.Second, 10*time.Millisecond)
	require.Contains(t, logs.String(), `msg="statement succeeds again" dispatcher=`)
}
