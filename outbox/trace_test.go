package outbox_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/tracecontext"
)

// staticProp is a Propagator that injects fixed headers, as an
// OpenTelemetry adapter injecting baggage would.
type staticProp tracecontext.Carrier

func (p staticProp) Inject(context.Context) tracecontext.Carrier { return tracecontext.Carrier(p) }
func (staticProp) Extract(ctx context.Context, _ tracecontext.Carrier) context.Context {
	return ctx
}

const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// Enqueue adds the trace context of its ctx to each message's headers,
// keeps a header the message sets itself (in any letter case), leaves the
// caller's map alone, and adds nothing without a trace context.
func TestEnqueueCopiesTheTraceContextIntoHeaders(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	headersOf := func(id uuid.UUID) map[string]string {
		var h map[string]string
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT headers FROM outbox WHERE id = $1`, id).Scan(&h))
		return h
	}

	ob := newOutbox(t, db, outbox.Config{})
	own := map[string]string{"Traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "X-Tenant": "acme"}
	plain := broker.Message{ID: uuid.New(), Subject: "orders.paid"}
	owning := broker.Message{ID: uuid.New(), Subject: "orders.paid", Headers: own}
	untraced := broker.Message{ID: uuid.New(), Subject: "orders.paid"}
	tctx := tracecontext.ContextWith(ctx, tracecontext.Context{Traceparent: tp, Tracestate: "congo=t61rcWkgMzE"})
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := ob.Enqueue(tctx, tx, plain, owning); err != nil {
			return err
		}
		_, err := ob.Enqueue(ctx, tx, untraced)
		return err
	}))
	require.Equal(t, map[string]string{"traceparent": tp, "tracestate": "congo=t61rcWkgMzE"}, headersOf(plain.ID))
	require.Equal(t, map[string]string{"Traceparent": own["Traceparent"], "X-Tenant": "acme", "tracestate": "congo=t61rcWkgMzE"},
		headersOf(owning.ID))
	require.Len(t, own, 2, "the caller's map is not modified")
	require.Nil(t, headersOf(untraced.ID))

	// A propagator's header that could not travel is dropped, not an error.
	ob = newOutbox(t, db, outbox.Config{Propagator: staticProp{"baggage": "a=1", "bad header": "x", "x-evil": "a\r\nb", broker.HeaderKey: "k"}})
	m := broker.Message{ID: uuid.New(), Subject: "orders.paid"}
	enqueue(t, db, ob, m)
	require.Equal(t, map[string]string{"baggage": "a=1"}, headersOf(m.ID))
}
