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

func TestJSONDeadLettersUndecodable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	type payment struct{ Amount int }
	h := inbox.JSON(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message, p payment) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (message_id, seq) VALUES ($1, $2)`, msg.ID, p.Amount)
		return err
	})
	c := b.start(b.source("d", 5*time.Second), h, b.config("c"))
	good, bad := b.msg("", 0), b.msg("", 0)
	good.Payload, bad.Payload = []byte(`{"Amount": 42}`), []byte(`{"Amount": "forty-two"`)
	b.publish(good, bad)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == 1 && s.DeadLettered == 1 })
	require.Equal(t, 42, b.count(`SELECT seq FROM effects`))
	var reason string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT reason FROM dead_letters`).Scan(&reason))
	require.Contains(t, reason, "permanent: undecodable payload: ")
}
