package idempotency_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
)

// liveRecords returns oncekit_idempotency_live_records as
// "operation/state" -> value.
func liveRecords(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "oncekit_idempotency_live_records" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			got[labels["operation"]+"/"+labels["state"]] = m.GetGauge().GetValue()
		}
	}
	return got
}

// Prune counts the records holding their key by operation and state: not
// the expired ones, and with the operations beyond the 50 largest summed
// under _other, so the label stays bounded however many operations share
// the table.
func TestLiveRecordsByOperationAndState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	h := newHarness(t, idempotency.Route{}, &idempotency.Config{Registerer: reg})
	h.failRuns = 1 // the first request answers 503: released
	require.Equal(t, http.StatusServiceUnavailable, h.post(t, "acme", "pay-released-ac9f1c2e", `{"amount":1}`).status)
	for _, key := range []string{"pay-a-ac9f1c2e0b7d", "pay-b-ac9f1c2e0b7d", "pay-old-ac9f1c2e0b7d"} {
		require.Equal(t, http.StatusCreated, h.post(t, "acme", key, `{"amount":2}`).status)
	}
	refunds := newHarnessOn(t, h.db, idempotency.Route{Operation: "refund"}, nil)
	require.Equal(t, http.StatusCreated, refunds.post(t, "acme", "refund-1-ac9f1c2e0b7d", `{"amount":3}`).status)
	_, err := h.db.Pool.Exec(ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = $1`,
		idempotency.StoredKey("pay-old-ac9f1c2e0b7d"))
	require.NoError(t, err)
	_, err = h.db.Pool.Exec(ctx, `INSERT INTO idempotency_keys (tenant, operation, key, fingerprint, state, locked_until, expires_at)
		SELECT 'acme', 'create-payment', 'stuck', '\x00', 'unknown', NULL, now() - interval '1 day'`)
	require.NoError(t, err)

	_, err = h.edge.Prune(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]float64{
		"create-payment/completed": 2, "create-payment/released": 1, "create-payment/unknown": 1, "refund/completed": 1,
	}, liveRecords(t, reg))

	// 60 more operations, op-01 with 61 records … op-60 with 2: the 50
	// largest are kept, and the rest summed.
	_, err = h.db.Pool.Exec(ctx, `INSERT INTO idempotency_keys (tenant, operation, key, fingerprint, state, status_code, expires_at)
		SELECT 'acme', 'op-' || lpad(o::text, 2, '0'), 'k-' || i, '\x00', 'completed', 201, now() + interval '1 hour'
		FROM generate_series(1, 60) o, generate_series(1, 62 - o) i`)
	require.NoError(t, err)
	_, err = h.edge.Prune(ctx)
	require.NoError(t, err)
	got := liveRecords(t, reg)
	require.Len(t, got, 50+3, "50 operations' series and _other's three states")
	require.Equal(t, float64(61), got["op-01/completed"])
	require.Equal(t, float64(12), got["op-50/completed"])
	require.Equal(t, float64(11+2)*10/2+2+1, got["_other/completed"], "op-51 … op-60, create-payment and refund")
	require.Equal(t, float64(1), got["_other/unknown"])
	require.NotContains(t, got, "refund/completed", "a small operation beyond the cap")
	var total float64
	for _, v := range got {
		total += v
	}
	require.Equal(t, float64(4+1+(61+2)*60/2), total, "every live record counted once")
}
