package idempotency_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
)

// The status resource answers a key's record in the caller's scope, and
// nothing of another scope's: in progress while the handler runs, then
// completed with the stored status and the resource's Location.
func TestStatusResourceAnswersTheCallersRecordOnly(t *testing.T) {
	t.Parallel()
	h := newHarness(t, idempotency.Route{Mode: idempotency.Separate}, nil)
	status, err := h.edge.StatusHandler(&idempotency.Route{Operation: "create-payment", Tenant: tenantFromHeader})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("GET /idempotency/{key}", status)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	get := func(tenant, key string) (int, idempotency.Status) {
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/idempotency/"+key, nil)
		require.NoError(t, err)
		req.Header.Set("X-Tenant", tenant)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var st idempotency.Status
		if resp.StatusCode == http.StatusOK {
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
		}
		return resp.StatusCode, st
	}

	code, _ := get("acme", "pay-1")
	require.Equal(t, http.StatusNotFound, code, "no record yet")

	release := h.withGate()
	done := make(chan response, 1)
	go func() { done <- postInBackground(t, h.srv.URL+"/payments", "acme", "pay-1", `{"amount":100}`) }()
	<-h.inside
	code, st := get("acme", "pay-1")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, idempotency.StateInProgress, st.State)
	require.Zero(t, st.StatusCode)
	release()
	first := <-done
	require.Equal(t, http.StatusCreated, first.status)

	code, st = get("acme", "pay-1")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, idempotency.StateCompleted, st.State)
	require.Equal(t, http.StatusCreated, st.StatusCode)
	require.Equal(t, first.header.Get("Location"), st.Location)
	require.NotNil(t, st.CompletedAt)
	require.True(t, st.ExpiresAt.After(*st.CompletedAt))

	code, _ = get("globex", "pay-1")
	require.Equal(t, http.StatusNotFound, code, "another scope's key is not found")
	code, _ = get("", "pay-1")
	require.Equal(t, http.StatusForbidden, code, "no caller, no scope")
}

// Hostile keys on the status resource get 400, never a lookup or a 5xx:
// NUL, control characters, invalid UTF-8, an oversize key.
func TestStatusResourceRefusesHostileKeys(t *testing.T) {
	t.Parallel()
	h := newHarness(t, idempotency.Route{Mode: idempotency.Separate}, nil)
	status, err := h.edge.StatusHandler(&idempotency.Route{Operation: "create-payment", Tenant: tenantFromHeader})
	require.NoError(t, err)
	for _, key := range []string{"a\x00b", "a\x01b\x7f", "\xff\xfe", strings.Repeat("k", 4096), ""} {
		req := httptest.NewRequest(http.MethodGet, "/idempotency/x", nil)
		req.SetPathValue("key", key)
		req.Header.Set("X-Tenant", "acme")
		rec := httptest.NewRecorder()
		status.ServeHTTP(rec, req)
		require.Equal(t, http.StatusBadRequest, rec.Code, "%q", key)
		require.Contains(t, rec.Body.String(), idempotency.CodeInvalidKey)
	}
}
