package oncekitotel_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/oncekitotel"
	"github.com/oncekit/oncekit/oncekittest"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/sideeffect"
)

// One request makes one trace: the edge's server span is the parent of the
// relay's send span, which is the parent of (and linked from) the inbox's
// process span, which is the parent of the dispatcher's call to the
// provider. Real PostgreSQL and JetStream; the SDK's in-memory exporter.
func TestOneTraceFromTheEdgeToTheProviderCall(t *testing.T) {
	ctx := context.Background()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(ctx) })
	cfg := &oncekitotel.Config{TracerProvider: tp, Propagator: propagation.TraceContext{}}
	prop := oncekitotel.Propagator(cfg)

	db, n := oncekittest.NewDB(t), oncekittest.NewNATS(t)
	stream := strings.ToUpper(oncekittest.Name(t))
	_, err := natsjs.EnsureStream(ctx, n.JS, natsjs.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}})
	require.NoError(t, err)
	subject := stream + ".paid"

	// The edge: a payment request enqueues its event in its transaction.
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema, Propagator: prop})
	require.NoError(t, err)
	edge, err := idempotency.New(db.Pool, &idempotency.Config{Schema: db.Schema})
	require.NoError(t, err)
	route, err := edge.Route(&idempotency.Route{Operation: "pay", Mode: idempotency.SameTx, SharedScope: true})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /pay", oncekitotel.Edge(route(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.Tx(r)
		info, _ := idempotency.FromRequest(r)
		if _, err := ob.Enqueue(r.Context(), tx, broker.Message{ID: oncekit.DeriveID(info.ID().String(), "Paid"),
			Subject: subject, Key: info.ID().String(), Payload: []byte(`{}`)}); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})), cfg))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/pay", strings.NewReader(`{}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idempotency.HeaderKey, "key-1")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	// The relay publishes it; the consumer records a receipt; the
	// dispatcher sends it.
	pub, err := natsjs.NewPublisher(n.Conn, nil)
	require.NoError(t, err)
	relay, err := outbox.NewRelay(db.Pool, ob, oncekitotel.Publisher(pub, "nats", cfg), nil)
	require.NoError(t, err)
	oncekittest.DrainRelay(ctx, t, relay, db.Pool, ob)

	ledger, err := sideeffect.New(&sideeffect.Config{Schema: db.Schema, Propagator: prop})
	require.NoError(t, err)
	src, err := natsjs.NewSource(ctx, n.JS, &natsjs.SourceConfig{Stream: stream, Durable: "receipts"})
	require.NoError(t, err)
	h := oncekitotel.Handler(inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		_, err := ledger.Record(ctx, tx, sideeffect.Effect{SourceID: m.ID.String(), Kind: "receipt"})
		return err
	}), "nats", cfg)
	consumer, err := inbox.NewConsumer(db.Pool, src, h, &inbox.Config{Name: "receipts", Schema: db.Schema, Propagator: prop})
	require.NoError(t, err)
	require.Equal(t, inbox.Stats{Processed: 1}, oncekittest.DrainConsumer(ctx, t, consumer, 1))

	email := sideeffect.ProviderFunc(func(context.Context, sideeffect.Call) (string, error) { return "sent", nil })
	dispatcher, err := sideeffect.NewDispatcher(db.Pool, ledger, map[string]sideeffect.Provider{"receipt": oncekitotel.Provider(email, cfg)}, nil)
	require.NoError(t, err)
	oncekittest.DrainDispatcher(ctx, t, dispatcher, db.Pool, ledger)

	spans := map[string]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		spans[s.Name] = s
	}
	server, send, process, call := spans["POST /pay"], spans["send "+subject], spans["process "+subject], spans["call receipt"]
	for name, s := range map[string]tracetest.SpanStub{"server": server, "send": send, "process": process, "call": call} {
		require.True(t, s.SpanContext.IsValid(), "no %s span among %d", name, len(spans))
		require.Equal(t, server.SpanContext.TraceID(), s.SpanContext.TraceID(), "%s span in another trace", name)
	}
	require.Equal(t, trace.SpanKindServer, server.SpanKind)
	require.Equal(t, server.SpanContext.SpanID(), send.Parent.SpanID(), "send is the edge's child")
	require.Equal(t, trace.SpanKindProducer, send.SpanKind)
	require.Equal(t, send.SpanContext.SpanID(), process.Parent.SpanID(), "process is send's child")
	require.Len(t, process.Links, 1)
	require.Equal(t, send.SpanContext.SpanID(), process.Links[0].SpanContext.SpanID(), "process links the producer's span")
	require.Equal(t, trace.SpanKindConsumer, process.SpanKind)
	require.Equal(t, process.SpanContext.SpanID(), call.Parent.SpanID(), "the provider call is process's child")
	require.Equal(t, trace.SpanKindClient, call.SpanKind)
}
