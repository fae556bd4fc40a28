package idempotency_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
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

// countingTransport counts the status resource's polls it sends, and
// closes polled once it has sent three.
type countingTransport struct {
	base   http.RoundTripper
	polls  atomic.Int64
	polled chan struct{}
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet && c.polls.Add(1) == 3 {
		close(c.polled)
	}
	return c.base.RoundTrip(r)
}

// On an unknown outcome the Transport does not retry blindly: it polls the
// status resource until an operator settles the record, and then gets the
// settled answer with the same key.
func TestTransportPollsTheStatusOfAnUnknownOutcome(t *testing.T) {
	t.Parallel()
	h := newHarness(t, idempotency.Route{Mode: idempotency.Separate, UnknownOutcomes: &idempotency.UnknownOutcomes{StatusPath: "/idempotency/{digest}"}}, nil)
	h.provider = newFakeProvider(t)
	h.provider.dropNext.Store(true)
	counting := &countingTransport{base: http.DefaultTransport, polled: make(chan struct{})}
	tr := &idempotency.Transport{Base: counting, MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}

	done := make(chan struct{})
	go func() {
		defer close(done)
		<-counting.polled // the operator looks once the client has polled a few times
		assert.NoError(t, h.edge.Resolve(context.Background(), h.db.Pool,
			idempotency.Ref{Tenant: "acme", Operation: "create-payment", Key: "pay-1"},
			idempotency.Resolution{State: idempotency.StateCompleted, Response: idempotency.StoredResponse{
				StatusCode: http.StatusCreated, Body: []byte(`{"resolved":true}`)}},
			idempotency.Decision{By: "ana", Note: "charged"}))
	}()
	req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/payments", strings.NewReader(`{"amount":100}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant", "acme")
	req.Header.Set(idempotency.HeaderKey, "pay-1")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	<-done
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, string(body))
	require.JSONEq(t, `{"resolved":true}`, string(body))
	require.EqualValues(t, 1, h.runs.Load(), "the handler ran once")
	require.GreaterOrEqual(t, counting.polls.Load(), int64(3))
}

// lossyProxy forwards every request to upstream and drops every fifth
// answer after upstream gave it: the operation happened, the client heard
// nothing.
func lossyProxy(t *testing.T, upstream string) (url string, dropped *atomic.Int64) {
	var n atomic.Int64
	dropped = &atomic.Int64{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out, err := http.NewRequestWithContext(r.Context(), r.Method, upstream+r.URL.RequestURI(), r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		out.Header = r.Header.Clone()
		resp, err := http.DefaultTransport.RoundTrip(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if n.Add(1)%5 == 0 {
			dropped.Add(1)
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, dropped
}

// N intents sent through the Transport to the edge, behind a proxy that
// drops 20% of the answers, give exactly N operations, and every intent
// gets its answer.
func TestTransportThroughALossyProxy(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, idempotency.Route{Mode: mode}, nil)
			proxy, dropped := lossyProxy(t, h.srv.URL)
			client := &http.Client{Transport: &idempotency.Transport{MaxAttempts: 10, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}}
			const intents = 50
			for i := range intents {
				req, err := http.NewRequest(http.MethodPost, proxy+"/payments", strings.NewReader(fmt.Sprintf(`{"amount":%d}`, i+1)))
				require.NoError(t, err)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Tenant", "acme")
				resp, err := client.Do(req)
				require.NoError(t, err)
				require.NoError(t, resp.Body.Close())
				require.Equal(t, http.StatusCreated, resp.StatusCode)
			}
			require.GreaterOrEqual(t, dropped.Load(), int64(intents/5), "a fifth of the answers were lost")
			require.EqualValues(t, intents, h.runs.Load(), "one operation per intent")
			require.Equal(t, intents, count(t, h.db, `SELECT count(*) FROM payments`))
			require.Equal(t, intents, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE state = 'completed'`))
		})
	}
}
