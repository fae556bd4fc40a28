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
	status, err := h.edge.StatusHandler("create-payment")
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("GET /idempotency/{digest}", status)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	get := func(tenant, key string) (int, idempotency.Status) {
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/idempotency/"+idempotency.StoredKey(key), nil)
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

// Hostile handles on the status resource get 400, never a lookup or a
// 5xx: NUL, control characters, invalid UTF-8, an oversize or short one,
// upper-case hex, and a raw key where the digest belongs (a mount with
// {key}); so do hostile keys in the Idempotency-Key header, or none.
func TestStatusResourceRefusesHostileHandles(t *testing.T) {
	t.Parallel()
	h := newHarness(t, idempotency.Route{Mode: idempotency.Separate}, nil)
	status, err := h.edge.StatusHandler("create-payment")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, h.post(t, "acme", "pay-1", `{"amount":100}`).status)
	digest := idempotency.StoredKey("pay-1")
	ask := func(name, value, header string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/idempotency/x", nil)
		if name != "" {
			req.SetPathValue(name, value)
		}
		if header != "" {
			req.Header.Set(idempotency.HeaderKey, header)
		}
		req.Header.Set("X-Tenant", "acme")
		rec := httptest.NewRecorder()
		status.ServeHTTP(rec, req)
		return rec
	}
	for _, handle := range []string{"a\x00b", digest[:63] + "\x00", "a\x01b\x7f", "\xff\xfe", strings.Repeat("a", 4096),
		digest[:63], digest + "0", strings.ToUpper(digest), digest[:63] + "g"} {
		rec := ask("digest", handle, "")
		require.Equal(t, http.StatusBadRequest, rec.Code, "%q", handle)
		require.Contains(t, rec.Body.String(), idempotency.CodeInvalidHandle)
	}
	rec := ask("key", "pay-1", "")
	require.Equal(t, http.StatusBadRequest, rec.Code, "a raw key in the path is refused, even a known one")
	require.Contains(t, rec.Body.String(), idempotency.CodeInvalidHandle)
	for _, key := range []string{"a\x00b", "a\x01b\x7f", "\xff\xfe", strings.Repeat("k", 4096)} {
		rec := ask("", "", key)
		require.Equal(t, http.StatusBadRequest, rec.Code, "%q", key)
		require.Contains(t, rec.Body.String(), idempotency.CodeInvalidKey)
	}
	rec = ask("", "", "")
	require.Equal(t, http.StatusBadRequest, rec.Code, "no handle, no key")
	require.Contains(t, rec.Body.String(), idempotency.CodeInvalidKey)

	require.Equal(t, http.StatusOK, ask("digest", digest, "").Code, "the digest finds the record")
	require.Equal(t, http.StatusOK, ask("", "", "pay-1").Code, "so does the key in its header")
	require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM idempotency_keys`), "nothing stored by a status read")
}

// An UnknownOutcomes.StatusPath with {key} (the raw key in a URL) is a configuration error
// that says what to use instead; {digest} must appear once.
func TestStatusPathRefusesTheRawKey(t *testing.T) {
	t.Parallel()
	h := newHarness(t, idempotency.Route{Mode: idempotency.Separate}, nil)
	for path, want := range map[string]string{
		"/idempotency/{key}":             "{digest}",
		"/idempotency/{key}/{digest}":    "{digest}",
		"/idempotency/status":            "{digest} once",
		"/idempotency/{digest}/{digest}": "{digest} once",
	} {
		_, err := h.edge.Route(&idempotency.Route{Operation: "create-payment", Tenant: tenantFromHeader, UnknownOutcomes: &idempotency.UnknownOutcomes{StatusPath: path}})
		require.ErrorIs(t, err, idempotency.ErrInvalidConfig, path)
		require.ErrorContains(t, err, "Route.UnknownOutcomes.StatusPath", path)
		require.ErrorContains(t, err, want, path)
	}
	_, err := h.edge.Route(&idempotency.Route{Operation: "create-payment", Tenant: tenantFromHeader, UnknownOutcomes: &idempotency.UnknownOutcomes{StatusPath: "/idempotency/{digest}"}})
	require.NoError(t, err)
}

// The status resource is derived from the route built for its operation:
// it scopes records as that route does (here one shared scope, so no
// tenant is asked for), and an operation no route was built for is
// refused.
func TestStatusHandlerIsDerivedFromTheRoute(t *testing.T) {
	t.Parallel()
	h := newHarness(t, idempotency.Route{Mode: idempotency.Separate}, nil)
	_, err := h.edge.StatusHandler("refund")
	require.ErrorIs(t, err, idempotency.ErrInvalidConfig)
	require.ErrorContains(t, err, `"refund"`)

	_, err = h.edge.Route(&idempotency.Route{Operation: "refund", SharedScope: true})
	require.NoError(t, err)
	status, err := h.edge.StatusHandler("refund")
	require.NoError(t, err)
	req := httptest.NewRequest(http.MethodGet, "/idempotency/refund", nil)
	req.Header.Set(idempotency.HeaderKey, "refund-1")
	rec := httptest.NewRecorder()
	status.ServeHTTP(rec, req)
	require.Equal(t, http.StatusNotFound, rec.Code, rec.Body.String())
	require.Contains(t, rec.Body.String(), idempotency.CodeKeyNotFound)
}
