package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/inbox"
)

// Two failures in one batch: the first rolls back the run without
// savepoints, the second is undone by its savepoint in the run after; one is
// retried, one dead-lettered, and the others commit once.
func TestBatchWithTwoFailingMessages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msgs := make([]broker.Message, 20)
	for i := range msgs {
		msgs[i] = b.msg("", i)
	}
	retried, poison := msgs[3].ID, msgs[11].ID
	var mu sync.Mutex
	calls := map[uuid.UUID][]int{}
	var first sync.Once
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		mu.Lock()
		calls[msg.ID] = append(calls[msg.ID], msg.Attempt)
		mu.Unlock()
		first.Do(func() { waitDelivered(t, b, len(msgs)) })
		if err := insertEffect(ctx, tx, msg); err != nil {
			return err
		}
		// Both fail after writing: their rows must not commit.
		switch {
		case msg.ID == retried && msg.Attempt == 1:
			return errors.New("try again")
		case msg.ID == poison:
			_, err := tx.Exec(ctx, `INSERT INTO effects (message_id) VALUES (NULL)`)
			return inbox.Permanent(fmt.Errorf("poison: %w", err))
		}
		return nil
	})
	b.publish(msgs...)
	cfg := b.config("c")
	cfg.BatchSize = 20
	cfg.Concurrency = 1
	c := b.start(b.source("d", 5*time.Second), h, cfg)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == 19 && s.DeadLettered == 1 })
	require.Equal(t, inbox.Stats{Processed: 19, Retried: 1, DeadLettered: 1}, c.Stats())
	eff := b.effects()
	require.Len(t, eff, 19)
	for _, m := range msgs {
		if m.ID != poison {
			require.Equal(t, 1, eff[m.ID])
		}
	}
	require.Equal(t, 1, b.count(`SELECT count(*) FROM dead_letters WHERE message_id = $1`, poison.String()))
	require.Zero(t, b.count(`SELECT count(*) FROM processed_messages WHERE message_id = $1`, poison))
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{1, 2}, calls[retried])
	require.Equal(t, []int{1}, calls[poison], "a permanent failure is not run again")
}

// A batch larger than PostgreSQL's subtransaction cache runs again in parts
// of at most 64 messages after a failure: no transaction with a savepoint per
// message holds more, and every message but the failing one commits once.
func TestLargeBatchRunsAgainInParts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 150
	msgs := make([]broker.Message, n)
	for i := range msgs {
		msgs[i] = b.msg("", i)
	}
	var failing atomic.Value      // the message that failed: the first to run in a batch of more than 64
	var afterFailure atomic.Int64 // most claims a transaction held after the failure
	var first sync.Once
	var cons atomic.Pointer[inbox.Consumer]
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		// Hold the first batch until the source has handed every message
		// over to the consumer, so that the next batch takes all the rest.
		first.Do(func() {
			waitDelivered(t, b, n)
			require.Eventually(t, func() bool { c := cons.Load(); return c != nil && inbox.InHand(c) == n },
				30*time.Second, 10*time.Millisecond, "the consumer holds every message")
		})
		var held int64
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM processed_messages WHERE xmin = xid(pg_current_xact_id())`).Scan(&held); err != nil {
			return err
		}
		if failing.Load() == nil && held > 64 && failing.CompareAndSwap(nil, msg.ID) {
			return errors.New("try again")
		}
		if failing.Load() != nil {
			for cur := afterFailure.Load(); held > cur && !afterFailure.CompareAndSwap(cur, held); cur = afterFailure.Load() {
			}
		}
		return insertEffect(ctx, tx, msg)
	})
	b.publish(msgs...)
	cfg := b.config("c")
	cfg.BatchSize = n
	cfg.Concurrency = 1
	c := b.start(b.source("d", 5*time.Second), h, cfg)
	cons.Store(c)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == n })
	require.NotNil(t, failing.Load(), "a batch of more than 64 ran")
	require.Equal(t, inbox.Stats{Processed: n, Retried: 1}, c.Stats())
	eff := b.effects()
	require.Len(t, eff, n)
	for _, m := range msgs {
		require.Equal(t, 1, eff[m.ID])
	}
	require.Positive(t, afterFailure.Load())
	require.LessOrEqual(t, afterFailure.Load(), int64(64), "after the failure, no transaction claims more than 64")
}
