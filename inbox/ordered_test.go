package inbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
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

// Ordered mode: the messages queued behind a key retrying in place are kept
// in progress with the broker, so its ack wait does not redeliver them (each
// redelivery would queue another copy behind the first and spend one of the
// source's MaxDeliver).
func TestOrderedRetryKeepsQueuedMessagesInProgress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	stuck := b.msg("k", 0)
	msgs := []broker.Message{stuck}
	for seq := 1; seq <= 5; seq++ {
		msgs = append(msgs, b.msg("k", seq))
	}
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		if msg.ID == stuck.ID && msg.Attempt < 3 {
			return errors.New("not yet")
		}
		return insertEffect(ctx, tx, msg)
	})
	// The consumer signals progress every ackWait/3: a long ack wait leaves
	// a late tick on a loaded machine plenty of slack.
	const ackWait = 2 * time.Second
	cfg := b.config("c")
	cfg.Ordered = true
	cfg.Concurrency = 2
	backoff := ackWait + ackWait/4 // each wait outlasts the ack wait
	cfg.Backoff = inbox.ExponentialBackoff(backoff, backoff)
	c := b.start(b.source("d", ackWait), h, cfg)
	b.publish(msgs...)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == int64(len(msgs)) })
	require.Zero(t, c.Stats().Duplicates, "no message was redelivered while it waited")
	require.Zero(t, b.count(`SELECT count(*) FROM effects WHERE seq > 0 AND attempt <> 1`))
}
