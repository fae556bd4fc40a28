package sideeffect_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/sideeffect"
	"github.com/oncekit/oncekit/tracecontext"
)

// Record stores the trace context of its ctx with the effect, and nothing
// (NULL) without one or with an invalid traceparent.
func TestRecordStoresTheTraceContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for src, rctx := range map[string]context.Context{
		"traced":   tracecontext.ContextWith(ctx, tracecontext.Context{Traceparent: tp, Tracestate: "congo=t61rcWkgMzE"}),
		"untraced": ctx,
		"invalid":  tracecontext.W3C{}.Extract(ctx, tracecontext.Carrier{"traceparent": "00-" + tp[3:35] + "-0000000000000000-01"}),
	} {
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			_, err := b.ledger.Record(rctx, tx, sideeffect.Effect{SourceID: src, Kind: "order.paid"})
			return err
		}))
	}
	stored := func(src string) map[string]string {
		var m map[string]string
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT trace FROM side_effects WHERE source_id = $1`, src).Scan(&m))
		return m
	}
	require.Equal(t, map[string]string{"traceparent": tp, "tracestate": "congo=t61rcWkgMzE"}, stored("traced"))
	require.Nil(t, stored("untraced"))
	require.Nil(t, stored("invalid"))
}
