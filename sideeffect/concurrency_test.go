package sideeffect_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/sideeffect"
)

// Four dispatchers race over the same rows; the provider checks that no key
// is ever in two calls at once and that each key acts once.
func TestFourDispatchersConfirmEachEffectOnce(t *testing.T) {
	t.Parallel()
	n := 10_000
	if testing.Short() {
		n = 1_000
	}
	b := setup(t)
	rc := newReceiver(t)
	var keys []string
	for i := range n / 1000 {
		keys = append(keys, b.record(t, fmt.Sprintf("k%d", i%2), 1000)...)
	}
	require.Len(t, keys, n)
	reg := prometheus.NewRegistry()
	for i := range 4 {
		cfg := fastConfig(b)
		cfg.ID = fmt.Sprintf("dispatcher-%d", i)
		cfg.Concurrency = 8
		cfg.BatchSize = 50
		cfg.Registerer = reg
		start(t, b, map[string]sideeffect.Provider{"k0": hook(rc, nil), "k1": hook(rc, nil)}, cfg)
	}
	b.waitState(t, sideeffect.StateConfirmed, n, 2*time.Minute)
	rc.check(t, keys)
	for _, k := range keys {
		require.Equal(t, 1, rc.callsOf(k), "each effect called once")
	}
	var multi int
	require.NoError(t, b.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM side_effects WHERE attempts <> 1`).Scan(&multi))
	require.Zero(t, multi)
	require.Equal(t, float64(n), metric(t, reg, "oncekit_sideeffect_transitions_total", map[string]string{"state": "confirmed", "kind": "k0"})+
		metric(t, reg, "oncekit_sideeffect_transitions_total", map[string]string{"state": "confirmed", "kind": "k1"}))
}

// Slow calls and a short lease: rows claimed by one dispatcher wait in its
// queue longer than their lease allows. They must be put back, not called
// late while another dispatcher re-fires them.
func TestQueuedRowsAreNeverCalledAfterTheirLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t)
	rc.setHook(func(w http.ResponseWriter, r *http.Request, key string, n int) bool {
		time.Sleep(150 * time.Millisecond) // a slow provider, not a wait for state
		return false
	})
	keys := b.record(t, "slow", 20)
	for i := range 2 {
		cfg := fastConfig(b)
		cfg.ID = fmt.Sprintf("d%d", i)
		cfg.Concurrency = 1
		cfg.CallTimeout = time.Second
		cfg.Lease = 1500 * time.Millisecond
		start(t, b, map[string]sideeffect.Provider{"slow": hook(rc, nil)}, cfg)
	}
	b.waitState(t, sideeffect.StateConfirmed, len(keys), 30*time.Second)
	rc.check(t, keys)
	for _, k := range keys {
		require.Equal(t, 1, rc.callsOf(k), "called once: never late, never twice")
	}
}
