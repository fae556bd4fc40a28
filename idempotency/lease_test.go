package idempotency_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
)

// A client that gives up (disconnects) does not stop the running handler, so
// the claim stays owned while the handler runs: a retry meanwhile answers 409
// instead of recovering the claim and executing a second time alongside it.
func TestLeaseRenewedAfterClientDisconnects(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	h := newHarness(t, idempotency.Route{Mode: idempotency.Separate, Lease: lease}, nil)
	release := h.withGate()
	defer release()

	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/payments", strings.NewReader(`{"amount":100}`))
		if err != nil {
			gone <- err
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Tenant", "acme")
		req.Header.Set(idempotency.HeaderKey, "pay-1")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		gone <- err
	}()
	<-h.inside
	cancel() // the client times out and hangs up while the handler runs
	require.Error(t, <-gone)

	client := &http.Client{Timeout: 5 * time.Second} // a second execution would block on the gate
	for start := time.Now(); time.Since(start) < 3*lease; {
		req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/payments", strings.NewReader(`{"amount":100}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Tenant", "acme")
		req.Header.Set(idempotency.HeaderKey, "pay-1")
		resp, err := client.Do(req)
		require.NoError(t, err, "a retry must not execute the handler again")
		resp.Body.Close()
		require.Equal(t, http.StatusConflict, resp.StatusCode)
		require.EqualValues(t, 1, h.runs.Load())
	}
	require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE token = 1 AND recoveries = 0`))
}
