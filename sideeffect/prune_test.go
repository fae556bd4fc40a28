package sideeffect_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/sideeffect"
)

// insertEffects adds n effects in state, recorded at (an SQL expression of
// g, the row's number) and in random physical order.
func (b *bundle) insertEffects(t *testing.T, n int, state, at string) {
	t.Helper()
	next := "NULL"
	switch state {
	case "pending", "fired":
		next = "now()"
	case "unknown":
		next = "'infinity'"
	}
	_, err := b.db.Pool.Exec(context.Background(), `INSERT INTO side_effects (source_id, kind, idempotency_key, state, next_attempt_at, created_at)
		SELECT gen_random_uuid()::text, 'k', md5(random()::text), '`+state+`', `+next+`, `+at+`
		FROM generate_series(1, $1) g ORDER BY random()`, n)
	require.NoError(t, err)
}

func (b *bundle) count(t *testing.T, sql string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), sql).Scan(&n))
	return n
}

func TestLedgerPruneDeletesExactlyThePastRetentionRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	old := `now() - interval '40 days' - g * interval '1 second'`
	b.insertEffects(t, 200, "confirmed", old)
	b.insertEffects(t, 30, "failed", old)
	for _, s := range []string{"pending", "fired", "unknown"} {
		b.insertEffects(t, 10, s, old)
	}
	b.insertEffects(t, 40, "confirmed", "now()")
	_, err := b.db.Pool.Exec(ctx, `CREATE TABLE shuffled AS SELECT * FROM side_effects ORDER BY random();
		TRUNCATE side_effects; INSERT INTO side_effects OVERRIDING SYSTEM VALUE SELECT * FROM shuffled`)
	require.NoError(t, err)
	log := &testenv.StatementLog{}
	pool := b.db.TracedPool(t, log)

	n, err := b.ledger.Prune(ctx, pool, time.Now().Add(-30*24*time.Hour), 7)
	require.NoError(t, err)
	require.EqualValues(t, 230, n, "every confirmed or failed effect past retention")
	require.Equal(t, 40, b.count(t, `SELECT count(*) FROM side_effects WHERE state = 'confirmed'`), "rows within retention stay")
	require.Zero(t, b.count(t, `SELECT count(*) FROM side_effects WHERE state = 'failed'`))
	require.Equal(t, 30, b.count(t, `SELECT count(*) FROM side_effects WHERE state IN ('pending', 'fired', 'unknown')`),
		"unsettled rows are never pruned")

	batches := log.Matching("DELETE FROM")
	require.Len(t, batches, 33, "one statement per 7 rows, the last one short")
	for i := 1; i < len(batches); i++ {
		prev, cur := batches[i-1].Args[1].(pgtype.TID), batches[i].Args[1].(pgtype.TID)
		require.Less(t, tidKey(prev), tidKey(cur), "batch %d starts after the row where batch %d ended", i+1, i)
	}
}

func tidKey(t pgtype.TID) uint64 { return uint64(t.BlockNumber)<<16 | uint64(t.OffsetNumber) }

func TestLedgerPruneFindsOldRowsBehindWhereTheLastPassEnded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	before := time.Now().Add(-30 * 24 * time.Hour)
	// Pages filled to a tenth, so that rows inserted later can land in them.
	_, err := b.db.Pool.Exec(ctx, `ALTER TABLE side_effects SET (fillfactor = 10)`)
	require.NoError(t, err)
	b.insertEffects(t, 300, "confirmed", `now() - interval '40 days'`)
	b.insertEffects(t, 50, "confirmed", `now()`)
	n, err := b.ledger.Prune(ctx, b.db.Pool, before, 50)
	require.NoError(t, err)
	require.EqualValues(t, 300, n)

	// Vacuum records the pages' free space, and a new session's rows land in
	// the first pages, before the rows the first pass ended at.
	_, err = b.db.Pool.Exec(ctx, `ALTER TABLE side_effects SET (fillfactor = 50)`)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `VACUUM side_effects`)
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, b.db.URL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `INSERT INTO side_effects (source_id, kind, idempotency_key, state, created_at)
		SELECT 'late-' || g, 'k', md5(g::text), 'failed', now() - interval '40 days' FROM generate_series(1, 20) g`)
	require.NoError(t, err)
	require.Equal(t, 20, b.count(t, `SELECT count(*) FROM side_effects
		WHERE state = 'failed' AND ctid < (SELECT min(ctid) FROM side_effects WHERE state = 'confirmed')`),
		"the new old rows are in the first pages")
	n, err = b.ledger.Prune(ctx, b.db.Pool, before, 50)
	require.NoError(t, err)
	require.EqualValues(t, 20, n)
	require.Equal(t, 50, b.count(t, `SELECT count(*) FROM side_effects`))
}

// The ledger is pruned by one pass at a time: a pass that finds another
// under way (its advisory lock held) leaves the rows to it at once, without
// waiting for it.
func TestLedgerPruneLeavesRowsToAPassUnderWay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	before := time.Now().Add(-30 * 24 * time.Hour)
	b.insertEffects(t, 50, "confirmed", `now() - interval '40 days'`)
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('oncekit.sideeffect.prune:"' || $1 || '"'))`, b.db.Schema)
	require.NoError(t, err)

	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := b.ledger.Prune(pctx, b.db.Pool, before, 10)
	require.NoError(t, err)
	require.Zero(t, n, "the pass under way deletes them")
	require.NoError(t, tx.Commit(ctx))
	n, err = b.ledger.Prune(ctx, b.db.Pool, before, 10)
	require.NoError(t, err)
	require.EqualValues(t, 50, n, "once it has ended, the next pass deletes them")
}

// A failed effect retried while a pass deletes it stays: the DELETE checks
// the row's state again.
func TestLedgerPruneKeepsAnEffectRetriedMeanwhile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.insertEffects(t, 50, "failed", `now() - interval '40 days'`)
	retry, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer retry.Rollback(ctx) //nolint:errcheck
	_, err = retry.Exec(ctx, `UPDATE side_effects SET state = 'pending', next_attempt_at = now()
		WHERE ctid = (SELECT ctid FROM side_effects ORDER BY ctid OFFSET 20 LIMIT 1)`)
	require.NoError(t, err)

	pruned := make(chan int64, 1)
	go func() {
		n, err := b.ledger.Prune(ctx, b.db.Pool, time.Now().Add(-30*24*time.Hour), 10)
		assert.NoError(t, err)
		pruned <- n
	}()
	// The pass's DELETE meets the retried row and waits for its transaction.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND position('oncekit.sideeffect.prune:"' || $1 || '"' IN query) > 0`, b.db.Schema).Scan(&n))
		return n > 0
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, retry.Commit(ctx))
	require.EqualValues(t, 49, <-pruned)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM side_effects WHERE state = 'pending'`))
}

func TestConcurrentLedgerPrunePassesDeleteEachRowOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertEffects(t, 2000, "confirmed", `now() - interval '40 days'`)
	b.insertEffects(t, 10, "confirmed", `now()`)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int64
		errs  []error
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := b.ledger.Prune(context.Background(), b.db.Pool, time.Now().Add(-30*24*time.Hour), 25)
			mu.Lock()
			defer mu.Unlock()
			total += n
			if err != nil {
				errs = append(errs, err)
			}
		}()
	}
	wg.Wait()
	require.Empty(t, errs)
	require.EqualValues(t, 2000, total, "each row counted by the pass that deleted it")
	require.Equal(t, 10, b.count(t, `SELECT count(*) FROM side_effects`))
}

// A batch that started at the table's first page read every page the pass
// had already emptied: a pass read on the order of rows²/batch pages. A pass
// now reads a few pages per row it deletes, however many rows it deletes.
func TestLedgerPruneReadsABoundedNumberOfPagesPerRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.insertEffects(t, 10000, "confirmed", `now() - interval '40 days'`)
	_, err := b.db.Pool.Exec(ctx, `VACUUM ANALYZE side_effects`)
	require.NoError(t, err)
	// One transaction, so that its own block counts can be read.
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	l, err := sideeffect.New(&sideeffect.Config{Schema: b.db.Schema})
	require.NoError(t, err)
	n, err := l.Prune(ctx, tx, time.Now().Add(-30*24*time.Hour), 10)
	require.NoError(t, err)
	require.EqualValues(t, 10000, n)
	var blocks int64
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_stat_get_xact_blocks_fetched('side_effects'::regclass)`).Scan(&blocks))
	t.Logf("%d heap blocks fetched for %d rows", blocks, n)
	require.Less(t, float64(blocks)/float64(n), 5.0, "heap blocks fetched per row deleted")
}
