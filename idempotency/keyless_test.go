package idempotency_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
)

// trail is everything a request leaves behind outside the request's own
// Idempotency-Key header: what a server span and an access log record of
// each request (method, route, URL, headers, status), what a client span
// records of each attempt (its URL), the answers' headers and problem
// bodies, and the edge's logs.
type trail struct {
	mu    sync.Mutex
	lines []string
	logs  bytes.Buffer
}

func (tr *trail) add(format string, args ...any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.lines = append(tr.lines, fmt.Sprintf(format, args...))
}

func (tr *trail) Write(p []byte) (int, error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.logs.Write(p)
}

func (tr *trail) String() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return strings.Join(tr.lines, "\n") + "\n" + tr.logs.String()
}

// spans records what a server span and an access log record of each
// request: everything but the Idempotency-Key header's value.
func (tr *trail) spans(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Clone()
		h.Del(idempotency.HeaderKey)
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		tr.add("server span: %s %s pattern=%q headers=%v status=%d response_headers=%v body=%s",
			r.Method, r.URL.String(), r.Pattern, h, rec.Code, rec.Header(), rec.Body.String())
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	})
}

// clientSpans records what a client span records of each attempt the
// Transport sends: its method and URL.
type clientSpans struct {
	tr     *trail
	base   http.RoundTripper
	polls  sync.Once
	polled chan struct{}
}

func (c *clientSpans) RoundTrip(r *http.Request) (*http.Response, error) {
	c.tr.add("client span: %s %s", r.Method, r.URL.String())
	if r.Method == http.MethodGet {
		c.polls.Do(func() { close(c.polled) })
	}
	return c.base.RoundTrip(r)
}

// A request's trail carries its key nowhere: not in the status link an
// unknown outcome gives (Link, instance), nor in the URL the Transport
// polls, nor in any span's URL or attribute, response header or problem,
// nor in the edge's logs (debug level) and metrics, through an unknown
// outcome, its resolution, a replay and a reuse with another body.
func TestARequestsTraceCarriesNoKey(t *testing.T) {
	t.Parallel()
	const key = "k-7Qx93zq-never-logged"
	tr := &trail{}
	reg := prometheus.NewRegistry()
	route := idempotency.Route{Mode: idempotency.Separate, UnknownOutcomes: &idempotency.UnknownOutcomes{StatusPath: "/idempotency/create-payment/{digest}"}}
	h := newHarness(t, route, &idempotency.Config{Registerer: reg,
		Logger: slog.New(slog.NewJSONHandler(tr, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	h.provider = newFakeProvider(t)
	h.provider.dropNext.Store(true)

	route.Operation, route.Tenant = "create-payment", tenantFromHeader
	mw, err := h.edge.Route(&route)
	require.NoError(t, err)
	status, err := h.edge.StatusHandler(route.Operation)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw(h.createPayment(h.db.Pool)))
	mux.Handle("GET /idempotency/create-payment/{digest}", status)
	srv := httptest.NewServer(tr.spans(mux))
	t.Cleanup(srv.Close)

	spans := &clientSpans{tr: tr, base: http.DefaultTransport, polled: make(chan struct{})}
	client := &http.Client{Transport: &idempotency.Transport{Base: spans, MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-spans.polled
		assert.NoError(t, h.edge.Resolve(context.Background(), h.db.Pool,
			idempotency.Ref{Tenant: "acme", Operation: "create-payment", Key: key},
			idempotency.Resolution{State: idempotency.StateCompleted, Response: idempotency.StoredResponse{
				StatusCode: http.StatusCreated, Body: []byte(`{"resolved":true}`)}},
			idempotency.Decision{By: "ana", Note: "charged"}))
	}()
	send := func(body string) int {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Tenant", "acme")
		req.Header.Set(idempotency.HeaderKey, key)
		resp, err := client.Do(req)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		tr.add("client answer: %d %v %s", resp.StatusCode, resp.Header, b)
		return resp.StatusCode
	}
	require.Equal(t, http.StatusCreated, send(`{"amount":100}`), "unknown, polled, resolved, answered")
	<-done
	require.Equal(t, http.StatusCreated, send(`{"amount":100}`), "replayed")
	require.Equal(t, http.StatusUnprocessableEntity, send(`{"amount":5}`), "another body: refused, and logged")
	families, err := reg.Gather()
	require.NoError(t, err)
	metrics := fmt.Sprint(families)

	all := tr.String() + metrics
	require.NotContains(t, all, key)
	require.Contains(t, all, "GET /idempotency/create-payment/"+idempotency.StoredKey(key), "the Transport polled the record by its digest")
	require.Contains(t, all, `"key_hash"`, "the reuse was logged, by hash")
}
