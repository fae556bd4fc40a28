package idempotency_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// preferServer serves POST /payments through a route of the given mode,
// with a handler that honours Prefer: return=minimal (an empty 201) or
// return=representation (the default: the payment in the body), and says
// which in Preference-Applied.
func preferServer(t *testing.T, route idempotency.Route) (url string, db *testenv.DB, runs *atomic.Int64) {
	t.Helper()
	db = testenv.NewDB(t)
	edge, err := idempotency.New(db.Pool, &idempotency.Config{Schema: db.Schema})
	require.NoError(t, err)
	route.Operation, route.Tenant = "create-payment", tenantFromHeader
	mw, err := edge.Route(&route)
	require.NoError(t, err)
	runs = &atomic.Int64{}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		w.Header().Set("Location", fmt.Sprintf("/payments/%d", n))
		if strings.Contains(r.Header.Get("Prefer"), "return=minimal") {
			w.Header().Set("Preference-Applied", "return=minimal")
			w.WriteHeader(http.StatusCreated)
			return
		}
		w.Header().Set("Preference-Applied", "return=representation")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]any{"id": n, "amount": 100})
	})))
	return newServer(t, mux), db, runs
}

// sendWith posts body under key with extra request headers.
func sendWith(t *testing.T, url, key, body string, headers map[string]string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/payments", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant", "acme")
	req.Header.Set(idempotency.HeaderKey, key)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultTransport.RoundTrip(req) // no transparent gzip: Accept-Encoding as set
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// Prefer, Accept, Accept-Encoding and Accept-Language ask for a
// representation of the answer; they do not change the operation, so they
// stay out of the fingerprint: a retry under the same key and body with
// other preferences replays the first answer as it was stored, with the
// Preference-Applied that tells the client which preference it got, and
// the handler runs once. Bad values of those headers (long, not UTF-8,
// control characters, missing) change nothing and are never stored.
func TestRepresentationHeadersStayOutOfTheFingerprint(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			url, db, runs := preferServer(t, idempotency.Route{Mode: mode})
			first := sendWith(t, url, "pay-pref-0001-ac9f1c2e", `{"amount":100}`, map[string]string{
				"Prefer": "return=representation", "Accept": "application/json", "Accept-Language": "en", "Accept-Encoding": "identity"})
			require.Equal(t, http.StatusCreated, first.status, first.body)
			require.NotEmpty(t, first.body)
			for _, headers := range []map[string]string{
				{"Prefer": "return=minimal", "Accept": "*/*", "Accept-Language": "de-CH, fr;q=0.5", "Accept-Encoding": "gzip, br"},
				{"Prefer": "respond-async, wait=5"},
				{}, // none
				{"Prefer": strings.Repeat("return=minimal, ", 400)},            // long
				{"Accept-Language": "\xff\xfe", "Prefer": "return=m\xe9nimal"}, // not UTF-8
			} {
				again := sendWith(t, url, "pay-pref-0001-ac9f1c2e", ` { "amount" : 100 } `, headers)
				require.Equal(t, http.StatusCreated, again.status, "%q: %s", headers, again.body)
				require.Equal(t, "true", again.header.Get(idempotency.HeaderReplayed), "%q", headers)
				require.Equal(t, first.body, again.body, "%q", headers)
				require.Equal(t, "return=representation", again.header.Get("Preference-Applied"), "%q", headers)
				require.Equal(t, first.header.Get("Location"), again.header.Get("Location"))
			}
			for _, raw := range []string{"Prefer: return=\x01minimal\r\n", "Prefer: a\x00b\r\n", "Accept: \r\n"} {
				status, body := rawPost(t, url, "Idempotency-Key: pay-pref-0002-ac9f1c2e\r\n"+raw)
				require.Contains(t, []int{http.StatusCreated, http.StatusBadRequest}, status, "%q: %s", raw, body)
			}
			require.LessOrEqual(t, runs.Load(), int64(2), "the bad headers ran the second key at most once")
			require.Zero(t, count(t, db, `SELECT count(*) FROM idempotency_keys
				WHERE response_headers::text ~ '(minimal|wait=|de-CH|gzip)'`),
				"a request header was stored")
			require.LessOrEqual(t, count(t, db, records), 2)
		})
	}
}

// A route whose processing does depend on a preference (Prefer:
// handling=strict, say) puts it in its validated command (Route.Command),
// and so in the fingerprint: the same key with another handling is a
// reuse.
func TestAPreferenceThatChangesTheOperationGoesInTheCommand(t *testing.T) {
	t.Parallel()
	command := func(r *http.Request, body []byte) ([]byte, error) {
		strict := strings.Contains(r.Header.Get("Prefer"), "handling=strict")
		return json.Marshal(map[string]any{"body": json.RawMessage(body), "strict": strict})
	}
	url, _, runs := preferServer(t, idempotency.Route{Command: command})
	first := sendWith(t, url, "pay-pref-0003-ac9f1c2e", `{"amount":100}`, map[string]string{"Prefer": "handling=strict"})
	require.Equal(t, http.StatusCreated, first.status, first.body)
	same := sendWith(t, url, "pay-pref-0003-ac9f1c2e", `{"amount":100}`, map[string]string{"Prefer": "handling=strict, return=minimal"})
	require.Equal(t, "true", same.header.Get(idempotency.HeaderReplayed), same.body)
	other := sendWith(t, url, "pay-pref-0003-ac9f1c2e", `{"amount":100}`, map[string]string{"Prefer": "handling=lenient"})
	require.Equal(t, http.StatusUnprocessableEntity, other.status, other.body)
	require.Equal(t, idempotency.CodeKeyReused, other.problemCode(t))
	require.EqualValues(t, 1, runs.Load())
}
