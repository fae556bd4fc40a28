package idempotency_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
)

// attemptLog is a server that answers each attempt from a script and keeps
// the keys and bodies it was sent.
type attemptLog struct {
	mu     sync.Mutex
	keys   []string
	bodies []string
	at     []time.Time
}

func scripted(t *testing.T, answer func(n int, w http.ResponseWriter) bool) (*httptest.Server, *attemptLog) {
	log := &attemptLog{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 1024)
		n, _ := r.Body.Read(buf)
		log.mu.Lock()
		log.keys = append(log.keys, r.Header.Get(idempotency.HeaderKey))
		log.bodies = append(log.bodies, string(buf[:n]))
		log.at = append(log.at, time.Now())
		attempt := len(log.keys)
		log.mu.Unlock()
		if !answer(attempt, w) { // drop the connection without an answer
			hj, _ := w.(http.Hijacker)
			conn, _, _ := hj.Hijack()
			_ = conn.Close()
		}
	}))
	t.Cleanup(srv.Close)
	return srv, log
}

func send(t *testing.T, tr *idempotency.Transport, url, key string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":100}`))
	require.NoError(t, err)
	if key != "" {
		req.Header.Set(idempotency.HeaderKey, key)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

// Every attempt of a request carries the same key and body; lost answers,
// 503 and 409 in progress are retried; Retry-After is honoured.
func TestTransportRetriesOneIntentUnderOneKey(t *testing.T) {
	t.Parallel()
	srv, log := scripted(t, func(n int, w http.ResponseWriter) bool {
		switch n {
		case 1:
			return false // the answer is lost
		case 2:
			w.WriteHeader(http.StatusServiceUnavailable)
		case 3:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusConflict)
		default:
			w.WriteHeader(http.StatusCreated)
		}
		return true
	})
	resp := send(t, &idempotency.Transport{MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond}, srv.URL, "")
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Len(t, log.keys, 4)
	require.NotEmpty(t, log.keys[0])
	for i := range log.keys {
		require.Equal(t, log.keys[0], log.keys[i], "one key for every attempt")
		require.Equal(t, `{"amount":100}`, log.bodies[i], "the same body every attempt")
	}
	require.GreaterOrEqual(t, log.at[3].Sub(log.at[2]), time.Second, "Retry-After honoured")

	// A second request is a new intent: a new key.
	again, log2 := scripted(t, func(int, http.ResponseWriter) bool { return true })
	send(t, &idempotency.Transport{}, again.URL, "")
	require.NotEqual(t, log.keys[0], log2.keys[0])
}

// A definite answer (422 reused, 400, 404...) comes back at once, the
// caller's own key is kept, attempts are bounded, and a Retry-After longer
// than allowed ends the retries.
func TestTransportStopsAtDefiniteAnswersAndBounds(t *testing.T) {
	t.Parallel()
	srv, log := scripted(t, func(_ int, w http.ResponseWriter) bool {
		w.WriteHeader(http.StatusUnprocessableEntity)
		return true
	})
	require.Equal(t, http.StatusUnprocessableEntity, send(t, &idempotency.Transport{}, srv.URL, "client-key-1").StatusCode)
	require.Equal(t, []string{"client-key-1"}, log.keys)

	busy, blog := scripted(t, func(_ int, w http.ResponseWriter) bool {
		w.WriteHeader(http.StatusServiceUnavailable)
		return true
	})
	require.Equal(t, http.StatusServiceUnavailable, send(t, &idempotency.Transport{MaxAttempts: 3, MinBackoff: time.Millisecond}, busy.URL, "").StatusCode)
	require.Len(t, blog.keys, 3)

	slow, slowLog := scripted(t, func(_ int, w http.ResponseWriter) bool {
		w.Header().Set("Retry-After", "3600")
		w.WriteHeader(http.StatusTooManyRequests)
		return true
	})
	require.Equal(t, http.StatusTooManyRequests, send(t, &idempotency.Transport{}, slow.URL, "").StatusCode)
	require.Len(t, slowLog.keys, 1, "an hour's Retry-After is the caller's to decide")
}

// Against the real edge: a handler that fails twice with 503 runs a third
// time under the same key, and the payment exists once.
func TestTransportAgainstTheEdge(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, idempotency.Route{Mode: mode}, nil)
			h.failRuns = 2
			req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/payments", strings.NewReader(`{"amount":100}`))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Tenant", "acme")
			resp, err := (&http.Client{Transport: &idempotency.Transport{MinBackoff: time.Millisecond}}).Do(req)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			require.EqualValues(t, 3, h.runs.Load())
			require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM payments`))
		})
	}
}
