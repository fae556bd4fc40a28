package tracecontext_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/oncekittest"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/sideeffect"
	"github.com/oncekit/oncekit/sideeffect/webhook"
	"github.com/oncekit/oncekit/tracecontext"
)

// A traceparent set on the context of Enqueue arrives unchanged in the inbox
// handler's context and on the webhook provider's HTTP request: outbox →
// relay → JetStream → inbox (one batch, each handler call with its own
// message's trace) → Record → dispatcher → webhook receiver. A message
// enqueued without a trace context carries none anywhere.
func TestTraceContextTravelsFromEnqueueToWebhook(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := oncekittest.NewDB(t)
	n := oncekittest.NewNATS(t)
	stream, subject := strings.ToUpper(oncekittest.Name(t)), oncekittest.Name(t)+".paid"
	_, err := natsjs.EnsureStream(ctx, n.JS, natsjs.StreamConfig{Name: stream, Subjects: []string{subject}})
	require.NoError(t, err)

	traces := map[string]tracecontext.Context{
		"order-1": {Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Tracestate: "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"},
		"order-2": {Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"},
		"order-3": {}, // no trace context
	}
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	for _, order := range []string{"order-1", "order-2", "order-3"} {
		ectx := ctx
		if tc := traces[order]; tc.Traceparent != "" {
			ectx = tracecontext.ContextWith(ctx, tc)
		}
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := ob.Enqueue(ectx, tx, broker.Message{ID: oncekit.DeriveID(order, "OrderPaid"), Subject: subject, Key: order, Payload: []byte(`{}`)})
			return err
		}))
	}
	pub, err := natsjs.NewPublisher(n.Conn, nil)
	require.NoError(t, err)
	relay, err := outbox.NewRelay(db.Pool, ob, pub, nil)
	require.NoError(t, err)
	oncekittest.DrainRelay(ctx, t, relay, db.Pool, ob)

	// The inbox handler sees its own message's trace context, in one batch.
	ledger, err := sideeffect.New(&sideeffect.Config{Schema: db.Schema})
	require.NoError(t, err)
	var mu sync.Mutex
	seen := map[string]tracecontext.Context{}
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		tc, _ := tracecontext.FromContext(ctx)
		mu.Lock()
		seen[m.Key] = tc
		mu.Unlock()
		_, err := ledger.Record(ctx, tx, sideeffect.Effect{SourceID: m.Key, Kind: "webhook.paid", Payload: m.Payload})
		return err
	})
	src, err := natsjs.NewSource(ctx, n.JS, &natsjs.SourceConfig{Stream: stream, Durable: "paid"})
	require.NoError(t, err)
	consumer, err := inbox.NewConsumer(db.Pool, src, h, &inbox.Config{Name: "paid", Schema: db.Schema, BatchSize: 10})
	require.NoError(t, err)
	require.Equal(t, inbox.Stats{Processed: 3}, oncekittest.DrainConsumer(ctx, t, consumer, 3))
	require.Equal(t, traces, seen)

	// The webhook receiver gets the same headers; the provider's ctx holds
	// the same trace context.
	type got struct{ traceparent, tracestate string }
	received := map[string]got{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		received[r.Header.Get(webhook.HeaderIdempotencyKey)] = got{r.Header.Get("traceparent"), r.Header.Get("tracestate")}
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	hook, err := webhook.New(&webhook.Config{URL: srv.URL, Unsigned: true})
	require.NoError(t, err)
	inCall := map[string]tracecontext.Context{}
	provider := sideeffect.ProviderFunc(func(ctx context.Context, c sideeffect.Call) (string, error) {
		tc, _ := tracecontext.FromContext(ctx)
		mu.Lock()
		inCall[c.SourceID] = tc
		mu.Unlock()
		return hook.Call(ctx, c)
	})
	dispatcher, err := sideeffect.NewDispatcher(db.Pool, ledger, map[string]sideeffect.Provider{"webhook.paid": provider}, nil)
	require.NoError(t, err)
	oncekittest.DrainDispatcher(ctx, t, dispatcher, db.Pool, ledger)

	require.Equal(t, traces, inCall)
	for order, tc := range traces {
		require.Equal(t, got{tc.Traceparent, tc.Tracestate}, received[oncekit.DeriveKey(order, "webhook.paid")], order)
	}
}
