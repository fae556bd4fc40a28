package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/inbox"
)

func TestChainOrder(t *testing.T) {
	t.Parallel()
	var trace []string
	mw := func(name string) inbox.Middleware {
		return func(next inbox.Handler) inbox.Handler {
			return inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
				trace = append(trace, name)
				return next.Handle(ctx, tx, msg)
			})
		}
	}
	h := inbox.Chain(inbox.HandlerFunc(func(context.Context, pgx.Tx, *inbox.Message) error {
		trace = append(trace, "handler")
		return nil
	}), mw("outer"), mw("inner"))
	require.NoError(t, h.Handle(context.Background(), nil, &inbox.Message{}))
	require.Equal(t, []string{"outer", "inner", "handler"}, trace)
}

// The handler cannot end the consumer's transaction, in either mode.
func TestHandlerCannotEndTheTransaction(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 10} {
		b := setup(t)
		results := make(chan [2]error, 1)
		h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
			select {
			case results <- [2]error{tx.Commit(ctx), tx.Rollback(ctx)}:
			default:
			}
			return insertEffect(ctx, tx, msg)
		})
		cfg := b.config("c")
		cfg.BatchSize = batch
		c := b.start(b.source("d", 5*time.Second), h, cfg)
		b.publish(b.msg("", 1))
		waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == 1 })
		errs := <-results
		require.ErrorIs(t, errs[0], inbox.ErrTxOwned)
		require.ErrorIs(t, errs[1], inbox.ErrTxOwned)
		require.Len(t, b.effects(), 1)
	}
}
