package idempotency_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
)

// After its response's lifetime (TTL) and before the key's (KeyTTL), a
// retry is told the key expired, counted, and does not run; another body is
// still refused as a reuse; Prune empties the response and keeps the key's
// meaning. A route that runs expired retries runs it as new.
func TestRetryAfterTheResponseExpired(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			reg := prometheus.NewRegistry()
			h := newHarness(t, idempotency.Route{Mode: mode}, &idempotency.Config{Registerer: reg})
			require.Equal(t, http.StatusCreated, h.post(t, "acme", "pay-1", `{"amount":100}`).status)
			_, err := h.db.Pool.Exec(ctx, `UPDATE idempotency_keys SET body_expires_at = now() - interval '1 second'`)
			require.NoError(t, err)

			expired := h.post(t, "acme", "pay-1", `{"amount":100}`)
			require.Equal(t, http.StatusUnprocessableEntity, expired.status)
			require.Contains(t, expired.body, idempotency.CodeKeyExpired)
			reused := h.post(t, "acme", "pay-1", `{"amount":7}`)
			require.Contains(t, reused.body, idempotency.CodeKeyReused, "the key's meaning outlives its response")
			require.EqualValues(t, 1, h.runs.Load(), "neither ran")
			require.InDelta(t, 1, outcomeCount(t, reg, idempotency.OutcomeExpired), 0, "the expired retry is counted")

			_, err = h.edge.Prune(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM idempotency_keys
				WHERE state = 'completed' AND response_body IS NULL AND response_headers->>'Location' IS NOT NULL AND status_code = 201`),
				"the response body emptied, the key's meaning (status, Location) kept")

			run := newHarnessOn(t, h.db, idempotency.Route{Mode: mode, Responses: &idempotency.Responses{RunExpiredRetries: true}}, nil)
			again := run.post(t, "acme", "pay-1", `{"amount":100}`)
			require.Equal(t, http.StatusCreated, again.status, "run as new")
			require.Empty(t, again.header.Get(idempotency.HeaderReplayed))
			require.EqualValues(t, 1, run.runs.Load())
		})
	}
}

// outcomeCount is oncekit_idempotency_requests_total of one outcome.
func outcomeCount(t *testing.T, reg *prometheus.Registry, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "oncekit_idempotency_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// A route that runs expired retries runs only a retry: another body sent
// under the key after its response expired is still refused as a reuse
// (the key's meaning outlives its response), and runs nothing.
func TestRunExpiredRetriesStillRefusesAnotherBody(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, idempotency.Route{Mode: mode, Responses: &idempotency.Responses{RunExpiredRetries: true}}, nil)
			require.Equal(t, http.StatusCreated, h.post(t, "acme", "pay-1", `{"amount":100}`).status)
			_, err := h.db.Pool.Exec(context.Background(), `UPDATE idempotency_keys SET body_expires_at = now() - interval '1 second'`)
			require.NoError(t, err)

			other := h.post(t, "acme", "pay-1", `{"amount":7}`)
			require.Equal(t, http.StatusUnprocessableEntity, other.status, other.body)
			require.Contains(t, other.body, idempotency.CodeKeyReused)
			require.EqualValues(t, 1, h.runs.Load(), "another body under the key did not run")
			require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM payments`))

			again := h.post(t, "acme", "pay-1", `{"amount":100}`)
			require.Equal(t, http.StatusCreated, again.status, "the same body runs as new")
			require.EqualValues(t, 2, h.runs.Load())
		})
	}
}
