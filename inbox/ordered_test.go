package inbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/inbox"
)

// Ordered mode: a commit whose outcome is unknown (the backend died before
// COMMIT) is settled in place, through the claim, before the next message of
// its key runs; left to the broker's redelivery, it would run after them.
func TestOrderedUnknownCommitKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first, second := b.msg("k", 1), b.msg("k", 2)
	var killed atomic.Bool
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		if err := insertEffect(ctx, tx, msg); err != nil {
			return err
		}
		if msg.ID == first.ID && killed.CompareAndSwap(false, true) {
			var pid int
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			if _, err := b.db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1, 10000)`, pid); err != nil {
				return err
			}
		}
		return nil
	})
	cfg := b.config("c")
	cfg.Ordered = true
	cfg.Concurrency = 2
	c := b.start(b.source("d", 2*time.Second), h, cfg)
	b.publish(first, second)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == 2 })
	require.True(t, killed.Load())
	rows, err := b.db.Pool.Query(context.Background(), `SELECT seq FROM effects ORDER BY id`)
	require.NoError(t, err)
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	require.Equal(t, []int{1, 2}, seqs, "the key's messages took effect in order")
}
