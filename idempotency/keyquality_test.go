package idempotency_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
)

// keyQuality returns oncekit_idempotency_key_quality_total by kind.
func keyQuality(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "oncekit_idempotency_key_quality_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			require.Equal(t, "create-payment", labels["operation"])
			got[labels["kind"]] += m.GetCounter().GetValue()
		}
	}
	return got
}

// Keys that look like e-mail addresses, timestamps, counters or are short
// are accepted, run once, and counted by kind when they are new (a replay
// is not counted again); a UUID is counted as none.
func TestWeakKeysAreCountedNotRefused(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewRegistry()
			h := newHarness(t, idempotency.Route{Mode: mode}, &idempotency.Config{Registerer: reg})
			keys := []string{`"alice@example.com"`, "order-1732780800", "2026-11-28T09:12:00Z", "order-42", "17", "abc", uuid.NewString()}
			for i, key := range keys {
				body := fmt.Sprintf(`{"amount":%d}`, 100+i)
				for range 2 { // the first runs, the second replays
					resp := h.post(t, "acme", key, body)
					require.Equal(t, http.StatusCreated, resp.status, "%q: %s", key, resp.body)
				}
			}
			require.EqualValues(t, len(keys), h.runs.Load())
			require.Equal(t, map[string]float64{"email": 1, "timestamp": 2, "counter": 2, "short": 1}, keyQuality(t, reg))
		})
	}
}
