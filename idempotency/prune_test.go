package idempotency_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
)

// Case 10: Prune deletes expired completed records in bounded batches and
// leaves in_progress records alone, however old.
func TestPrune(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	h := newHarness(t, idempotency.Route{Mode: idempotency.Separate}, &idempotency.Config{RetentionBatch: 10, Registerer: reg})

	// A completed record through HTTP, then aged past its expiry.
	require.Equal(t, http.StatusCreated, h.post(t, "acme", "old", `{"amount":1}`).status)
	require.Equal(t, http.StatusCreated, h.post(t, "acme", "fresh", `{"amount":2}`).status)
	_, err := h.db.Pool.Exec(ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = $1`, idempotency.StoredKey("old"))
	require.NoError(t, err)

	// An in_progress record whose handler is running, aged past its expiry.
	release := h.withGate()
	defer release()
	done := make(chan response, 1)
	go func() { done <- postInBackground(t, h.srv.URL+"/payments", "acme", "running", `{"amount":3}`) }()
	<-h.inside
	_, err = h.db.Pool.Exec(ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1 hour' WHERE key = $1`, idempotency.StoredKey("running"))
	require.NoError(t, err)

	// Crashed owners' in_progress records and 25 expired completed ones.
	_, err = h.db.Pool.Exec(ctx, `INSERT INTO idempotency_keys (tenant, operation, key, fingerprint, state, locked_until, expires_at, created_at)
		SELECT 'acme', 'create-payment', 'crashed-' || i, '\x00', 'in_progress', now() - interval '2 days', now() - interval '1 day', now() - interval '3 days'
		FROM generate_series(1, 3) i`)
	require.NoError(t, err)
	_, err = h.db.Pool.Exec(ctx, `INSERT INTO idempotency_keys (tenant, operation, key, fingerprint, state, status_code, expires_at, completed_at)
		SELECT 'acme', 'create-payment', 'expired-' || i, '\x00', 'completed', 201, now() - interval '1 minute', now() - interval '1 day'
		FROM generate_series(1, 25) i`)
	require.NoError(t, err)

	deleted, err := h.edge.Prune(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 26, deleted) // 25 + "old", in batches of 10
	require.Equal(t, 0, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE state = 'completed' AND expires_at <= now()`))
	require.Equal(t, 4, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE state = 'in_progress'`))
	require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE key = $1`, idempotency.StoredKey("fresh")))
	require.InDelta(t, 4, metricValue(t, reg, "oncekit_idempotency_in_progress_records"), 0)
	require.GreaterOrEqual(t, metricValue(t, reg, "oncekit_idempotency_in_progress_oldest_age_seconds"), float64(3*24*3600-60))

	release()
	require.Equal(t, http.StatusCreated, (<-done).status)

	// The cleaned key is free again: a retry executes rather than replays.
	runs := h.runs.Load()
	resp := h.post(t, "acme", "old", `{"amount":1}`)
	require.Equal(t, http.StatusCreated, resp.status)
	require.Empty(t, resp.header.Get(idempotency.HeaderReplayed))
	require.Equal(t, runs+1, h.runs.Load())

	deleted, err = h.edge.Prune(ctx)
	require.NoError(t, err)
	require.Zero(t, deleted)
}

// An expired record not yet cleaned up no longer replays: the key is free.
func TestExpiredRecordIsFree(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, idempotency.Route{Mode: mode}, nil)
			require.Equal(t, http.StatusCreated, h.post(t, "acme", "k", `{"amount":1}`).status)
			_, err := h.db.Pool.Exec(context.Background(), `UPDATE idempotency_keys SET expires_at = now() - interval '1 second'`)
			require.NoError(t, err)
			resp := h.post(t, "acme", "k", `{"amount":7}`) // even a different request
			require.Equal(t, http.StatusCreated, resp.status, resp.body)
			require.Empty(t, resp.header.Get(idempotency.HeaderReplayed))
			require.EqualValues(t, 2, h.runs.Load())
			require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE token = 2 AND expires_at > now()`))
		})
	}
}

// metricValue gathers reg and returns the value of the named gauge or
// counter (or a histogram's sample count), summed over its label sets.
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	assert.NoError(t, err) // t.Errorf: safe in Eventually conditions
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var v float64
		for _, m := range mf.GetMetric() {
			v += m.GetGauge().GetValue() + m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
		return v
	}
	return 0 // a vector without children is not gathered yet
}
