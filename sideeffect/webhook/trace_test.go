package webhook_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/sideeffect"
	"github.com/oncekit/oncekit/sideeffect/webhook"
	"github.com/oncekit/oncekit/tracecontext"
)

// The effect's trace context goes out as request headers; a configured
// header of the same name wins, and a header that cannot be sent is
// dropped rather than failing the call.
func TestCallSendsTheTraceContext(t *testing.T) {
	t.Parallel()
	got := make(chan http.Header, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Clone()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	c := sideeffect.Call{ID: 1, Key: "k1", Kind: "order.paid", Attempt: 1, Payload: []byte(`{}`),
		Trace: tracecontext.Carrier{"traceparent": tp, "tracestate": "congo=t61rcWkgMzE", "bad": "a\nb"}}

	p, err := webhook.New(&webhook.Config{URL: srv.URL, Unsigned: true})
	require.NoError(t, err)
	_, err = p.Call(context.Background(), c)
	require.NoError(t, err)
	h := <-got
	require.Equal(t, tp, h.Get("traceparent"))
	require.Equal(t, "congo=t61rcWkgMzE", h.Get("tracestate"))
	require.Empty(t, h.Values("bad"))

	p, err = webhook.New(&webhook.Config{URL: srv.URL, Unsigned: true, Header: http.Header{"Tracestate": {"mine=1"}}})
	require.NoError(t, err)
	_, err = p.Call(context.Background(), sideeffect.Call{ID: 1, Key: "k2", Kind: "order.paid", Attempt: 1,
		Trace: tracecontext.Carrier{"traceparent": tp, "tracestate": "congo=t61rcWkgMzE"}})
	require.NoError(t, err)
	h = <-got
	require.Equal(t, tp, h.Get("traceparent"))
	require.Equal(t, []string{"mine=1"}, h.Values("tracestate"))
}
