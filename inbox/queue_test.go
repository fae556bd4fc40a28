package inbox_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

const queueEffect = `INSERT INTO effects (message_id, attempt) VALUES ($1, $2)`

// A batch whose handlers only queue their writes sends them all in one
// round trip: no handler statement travels alone, and each transaction's
// inserts share one batch. Every effect commits once.
func TestQueuedWritesTravelTogether(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msgs := b.msgs(20)
	var first sync.Once
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		first.Do(func() { waitDelivered(t, b, len(msgs)) })
		return inbox.Queue(ctx, tx, queueEffect, msg.ID, msg.Attempt)
	})
	b.publish(msgs...)
	log := &testenv.StatementLog{}
	cfg := b.config("c")
	cfg.BatchSize, cfg.Concurrency = len(msgs), 1
	c, err := inbox.NewConsumer(b.db.TracedPool(t, log), b.source("d", 5*time.Second), h, cfg)
	require.NoError(t, err)
	run(t, c)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == int64(len(msgs)) })

	inserts := log.Matching("INSERT INTO effects")
	require.Len(t, inserts, len(msgs))
	trips := map[int]bool{}
	for _, st := range inserts {
		require.NotZero(t, st.Batch, "a queued write is sent in a batch, never alone")
		trips[st.Batch] = true
	}
	txs := 0 // one claim per transaction
	for _, st := range log.Matching("processed_messages") {
		if strings.HasPrefix(st.SQL, "INSERT") {
			txs++
		}
	}
	require.Positive(t, txs)
	require.Len(t, trips, txs, "one round trip for each transaction's writes")
	eff := b.effects()
	require.Len(t, eff, len(msgs))
	for _, m := range msgs {
		require.Equal(t, 1, eff[m.ID])
	}
}

// A handler reads what it (or an earlier message's handler) queued: the
// queue is sent ahead of its direct statements, in order.
func TestQueuedWritesAreSentBeforeDirectStatements(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msgs := b.msgs(10)
	var mu sync.Mutex
	seen := map[uuid.UUID]int{} // rows of the batch visible to each handler, its own included
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		if err := inbox.Queue(ctx, tx, queueEffect, msg.ID, msg.Attempt); err != nil {
			return err
		}
		var own, all int
		if err := tx.QueryRow(ctx, `SELECT count(*) FILTER (WHERE message_id = $1), count(*) FROM effects`, msg.ID).Scan(&own, &all); err != nil {
			return err
		}
		if own != 1 {
			return inbox.Permanent(fmt.Errorf("own queued row not visible: %d", own))
		}
		mu.Lock()
		seen[msg.ID] = all
		mu.Unlock()
		return nil
	})
	b.publish(msgs...)
	cfg := b.config("c")
	cfg.BatchSize, cfg.Concurrency = len(msgs), 1
	c := b.start(b.source("d", 5*time.Second), h, cfg)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed+s.DeadLettered == int64(len(msgs)) })
	require.Equal(t, inbox.Stats{Processed: int64(len(msgs))}, c.Stats())
	require.Len(t, b.effects(), len(msgs))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, len(msgs))
}

// A queued statement that fails fails the message that queued it, as if its
// handler had returned the error, whichever statement sends it: the batch's
// commit, a later message's own read (which gets an error, and is not the
// one retried), or the message's savepoint (in the run after a failure).
// Each failing message is retried alone and every effect commits once; with
// BatchSize 1 the same holds one message at a time.
func TestQueuedStatementFailureFailsItsMessage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		batch   int
		failing []int // messages whose queued write fails on attempt 1
		read    bool  // messages 17 and 18 read, if they share message 16's first transaction
	}{
		{"sent-by-commit", 20, []int{16}, false},
		{"sent-by-later-read-then-savepoint", 20, []int{16, 19}, true},
		{"one-at-a-time", 1, []int{16, 19}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			msgs := make([]broker.Message, 20)
			index := map[uuid.UUID]int{}
			for i := range msgs {
				msgs[i] = b.msg("", i)
				index[msgs[i].ID] = i
			}
			failing := map[uuid.UUID]bool{}
			var failingIDs []uuid.UUID
			for _, i := range tc.failing {
				failing[msgs[i].ID] = true
				failingIDs = append(failingIDs, msgs[i].ID)
			}
			var mu sync.Mutex
			calls := map[uuid.UUID][]int{}
			var tx16 pgx.Tx // message 16's first transaction
			readers := 0
			var readErrs []error
			var first sync.Once
			h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
				first.Do(func() { waitDelivered(t, b, len(msgs)) })
				i := index[msg.ID]
				mu.Lock()
				calls[msg.ID] = append(calls[msg.ID], msg.Attempt)
				if i == 16 && msg.Attempt == 1 {
					tx16 = tx
				}
				read := tc.read && (i == 17 || i == 18) && tx == tx16
				if read {
					readers++
				}
				mu.Unlock()
				var id any = msg.ID
				if failing[msg.ID] && msg.Attempt == 1 {
					id = nil // message_id is NOT NULL: fails when sent
				}
				if err := inbox.Queue(ctx, tx, queueEffect, id, msg.Attempt); err != nil {
					return fmt.Errorf("Queue returned the statement's error at once: %w", err)
				}
				if read {
					var n int
					if err := tx.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&n); err != nil {
						mu.Lock()
						readErrs = append(readErrs, err)
						mu.Unlock()
						return err
					}
				}
				return nil
			})
			b.publish(msgs...)
			cfg := b.config("c")
			cfg.BatchSize, cfg.Concurrency = tc.batch, 1
			c := b.start(b.source("d", 5*time.Second), h, cfg)
			waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == int64(len(msgs)) })
			require.Equal(t, inbox.Stats{Processed: int64(len(msgs)), Retried: int64(len(failing))}, c.Stats())
			eff := b.effects()
			require.Len(t, eff, len(msgs))
			for _, m := range msgs {
				require.Equal(t, 1, eff[m.ID])
			}
			require.Equal(t, len(msgs), b.count(`SELECT count(*) FROM effects WHERE attempt = CASE WHEN message_id = ANY($1) THEN 2 ELSE 1 END`,
				pgsql.UUIDs(failingIDs)), "the failing messages commit on attempt 2, the others on attempt 1")
			mu.Lock()
			defer mu.Unlock()
			for id := range failing {
				require.Equal(t, []int{1, 2}, calls[id])
			}
			switch {
			case tc.batch == 1:
				require.Zero(t, readers, "one message a transaction")
			case readers > 0:
				// The first reader sent message 16's failing write and was
				// told so; the transaction ended there.
				require.Len(t, readErrs, 1)
				require.ErrorContains(t, readErrs[0], "earlier message")
			case tc.read:
				t.Log("message 16 ended its first transaction: its write was sent by the commit")
			}
		})
	}
}

// Outside a Consumer's transaction Queue is tx.Exec: it runs at once and
// returns the statement's error.
func TestQueueOnOtherTransactionsRunsAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	id := uuid.New()
	require.NoError(t, inbox.Queue(ctx, tx, queueEffect, id, 1))
	var n int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM effects WHERE message_id = $1`, id).Scan(&n))
	require.Equal(t, 1, n)
	require.Error(t, inbox.Queue(ctx, tx, queueEffect, nil, 1))
}

// run runs c until the test ends.
func run(t *testing.T, c *inbox.Consumer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}
