package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
)

// merchantReference is the tests' business key: the body's "ref".
func merchantReference(_ *http.Request, body []byte) (string, error) {
	var in struct {
		Ref string `json:"ref"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return "", fmt.Errorf("the body is not JSON: %w", err)
	}
	return in.Ref, nil
}

// A client that mints a new Idempotency-Key for a retry gets the first
// operation's answer through its business key, and the operation runs
// once; another request with the business key is refused with a link; a
// released first request frees it.
func TestBusinessKeyAnswersANewKeyFromTheFirstOperation(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewRegistry()
			h := newHarness(t, idempotency.Route{Mode: mode, BusinessKey: &idempotency.BusinessKey{Of: merchantReference}}, &idempotency.Config{Registerer: reg})
			first := h.post(t, "acme", "k-1", `{"amount":100,"ref":"inv-7"}`)
			require.Equal(t, http.StatusCreated, first.status)

			retried := h.post(t, "acme", "k-2", `{"amount":100,"ref":"inv-7"}`)
			require.Equal(t, http.StatusCreated, retried.status, retried.body)
			require.Equal(t, first.body, retried.body, "the original operation's answer")
			require.Equal(t, "true", retried.header.Get(idempotency.HeaderReplayed))
			require.EqualValues(t, 1, h.runs.Load())
			require.InDelta(t, 1, outcomeCount(t, reg, idempotency.OutcomeBusinessKey), 0)

			other := h.post(t, "acme", "k-3", `{"amount":999,"ref":"inv-7"}`)
			require.Equal(t, idempotency.CodeBusinessKeyReused, other.problemCode(t))
			require.Equal(t, first.header.Get("Location"), other.instance(t))
			require.Equal(t, "<"+first.header.Get("Location")+`>; rel="related"`, other.header.Get("Link"))

			require.Equal(t, http.StatusCreated, h.post(t, "other", "k-4", `{"amount":100,"ref":"inv-7"}`).status,
				"business keys are per scope")
			require.Equal(t, http.StatusCreated, h.post(t, "acme", "k-5", `{"amount":100,"ref":"inv-8"}`).status)
			require.EqualValues(t, 3, h.runs.Load())
			require.Zero(t, count(t, h.db, `SELECT count(*) FROM idempotency_business_keys WHERE business_key LIKE '%inv%'`),
				"business keys are stored as digests")

			h.status.Store(http.StatusServiceUnavailable)
			require.Equal(t, http.StatusServiceUnavailable, h.post(t, "acme", "k-6", `{"amount":1,"ref":"inv-9"}`).status)
			h.status.Store(0)
			require.Equal(t, http.StatusCreated, h.post(t, "acme", "k-7", `{"amount":1,"ref":"inv-9"}`).status,
				"a released request frees its business key")
		})
	}
}

// The business key outlives its Idempotency-Key: after the key's record is
// gone, a new key with the business key is still refused, linking the
// resource; and a route may refuse even the same request.
func TestBusinessKeySurvivesTheKeysExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newHarness(t, idempotency.Route{Mode: idempotency.SameTx, BusinessKey: &idempotency.BusinessKey{Of: merchantReference}}, nil)
	first := h.post(t, "acme", "k-1", `{"amount":100,"ref":"inv-7"}`)
	require.Equal(t, http.StatusCreated, first.status)
	_, err := h.db.Pool.Exec(ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	n, err := h.edge.Prune(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the key's record is gone")

	again := h.post(t, "acme", "k-2", `{"amount":100,"ref":"inv-7"}`)
	require.Equal(t, idempotency.CodeBusinessKeyReused, again.problemCode(t))
	require.Equal(t, first.header.Get("Location"), again.instance(t))
	require.EqualValues(t, 1, h.runs.Load(), "not run again after the key expired")

	strict := newHarnessOn(t, h.db, idempotency.Route{Operation: "strict", BusinessKey: &idempotency.BusinessKey{Of: merchantReference, Conflict: true}}, nil)
	require.Equal(t, http.StatusCreated, strict.post(t, "acme", "k-1", `{"amount":100,"ref":"inv-1"}`).status)
	require.Equal(t, idempotency.CodeBusinessKeyReused, strict.post(t, "acme", "k-2", `{"amount":100,"ref":"inv-1"}`).problemCode(t))

	_, err = h.db.Pool.Exec(ctx, `UPDATE idempotency_business_keys SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	_, err = h.edge.Prune(ctx)
	require.NoError(t, err)
	require.Zero(t, count(t, h.db, `SELECT count(*) FROM idempotency_business_keys`), "Prune deletes expired business keys")
}

// Requests racing with distinct keys and one business key run the
// operation once; every one of them answers the operation or 409.
func TestBusinessKeyRace(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, idempotency.Route{Mode: mode, BusinessKey: &idempotency.BusinessKey{Of: merchantReference}}, nil)
			const n = 16
			var wg sync.WaitGroup
			statuses := make([]int, n)
			for i := range n {
				wg.Go(func() {
					statuses[i] = postInBackground(t, h.srv.URL+"/payments", "acme", fmt.Sprintf("k-%d", i), `{"amount":100,"ref":"inv-7"}`).status
				})
			}
			wg.Wait()
			require.EqualValues(t, 1, h.runs.Load(), "one operation")
			for _, s := range statuses {
				require.Contains(t, []int{http.StatusCreated, http.StatusConflict}, s)
			}
			require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM payments`))
		})
	}
}

// A business key the route cannot read answers 400 and stores nothing.
func TestBusinessKeyError(t *testing.T) {
	t.Parallel()
	h := newHarness(t, idempotency.Route{BusinessKey: &idempotency.BusinessKey{Of: merchantReference}}, nil)
	bad := h.post(t, "acme", "k-1", `not json`)
	require.Equal(t, idempotency.CodeBodyInvalid, bad.problemCode(t))
	require.Zero(t, count(t, h.db, `SELECT count(*) FROM idempotency_keys`))
}
