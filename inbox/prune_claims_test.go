package inbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// claimsDB is a schema of its own and an inbox Store on it, for the tests of
// a retention pass, which need no broker.
func claimsDB(t *testing.T) (*testenv.DB, *inbox.Store) {
	t.Helper()
	db := testenv.NewDB(t)
	s, err := inbox.NewStore(db.Schema)
	require.NoError(t, err)
	return db, s
}

func execSQL(t *testing.T, db *testenv.DB, sql string) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), sql)
	require.NoError(t, err)
}

func countSQL(t *testing.T, db *testenv.DB, sql string) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), sql).Scan(&n))
	return n
}

func TestPruneClaimsDeletesExactlyThePastRetentionRows(t *testing.T) {
	t.Parallel()
	db, s := claimsDB(t)
	// In random physical order: 250 of c's claims past retention, 40 of c's
	// within it, and 60 of another consumer's past it.
	execSQL(t, db, `INSERT INTO processed_messages (consumer, message_id, processed_at)
		SELECT consumer, gen_random_uuid(), at FROM (
			SELECT 'c' AS consumer, now() - interval '2 hours' - g * interval '1 second' AS at FROM generate_series(1, 250) g
			UNION ALL SELECT 'c', now() - g * interval '1 second' FROM generate_series(1, 40) g
			UNION ALL SELECT 'other', now() - interval '2 hours' FROM generate_series(1, 60) g) r
		ORDER BY random()`)
	log := &testenv.StatementLog{}
	pool := db.TracedPool(t, log)

	n, err := s.PruneClaims(context.Background(), pool, "c", time.Now().Add(-time.Hour), 7)
	require.NoError(t, err)
	require.EqualValues(t, 250, n)
	require.Equal(t, 40, countSQL(t, db, `SELECT count(*) FROM processed_messages WHERE consumer = 'c'`), "claims within retention stay")
	require.Zero(t, countSQL(t, db, `SELECT count(*) FROM processed_messages WHERE consumer = 'c' AND processed_at < now() - interval '1 hour'`))
	require.Equal(t, 60, countSQL(t, db, `SELECT count(*) FROM processed_messages WHERE consumer = 'other'`), "another consumer's claims are its own business")

	batches := log.Matching("DELETE FROM")
	require.Len(t, batches, 36, "one statement per 7 rows, the last one short")
	for i := 1; i < len(batches); i++ {
		prev, cur := batches[i-1].Args[2].(pgtype.TID), batches[i].Args[2].(pgtype.TID)
		require.Less(t, tidKey(prev), tidKey(cur), "batch %d starts after the row where batch %d ended", i+1, i)
	}

	n, err = s.PruneClaims(context.Background(), pool, "c", time.Now().Add(-time.Hour), 7)
	require.NoError(t, err)
	require.Zero(t, n)
}

func tidKey(t pgtype.TID) uint64 { return uint64(t.BlockNumber)<<16 | uint64(t.OffsetNumber) }

func TestPruneClaimsFindsOldClaimsBehindWhereTheLastPassEnded(t *testing.T) {
	t.Parallel()
	db, s := claimsDB(t)
	ctx := context.Background()
	before := time.Now().Add(-time.Hour)
	// Pages filled to a tenth, so that rows inserted later can land in them.
	execSQL(t, db, `ALTER TABLE processed_messages SET (fillfactor = 10)`)
	execSQL(t, db, `INSERT INTO processed_messages (consumer, message_id, processed_at)
		SELECT 'c', gen_random_uuid(), now() - interval '2 hours' FROM generate_series(1, 1000)`)
	execSQL(t, db, `INSERT INTO processed_messages (consumer, message_id) SELECT 'c', gen_random_uuid() FROM generate_series(1, 200)`)
	n, err := s.PruneClaims(ctx, db.Pool, "c", before, 100)
	require.NoError(t, err)
	require.EqualValues(t, 1000, n)

	// Vacuum records the pages' free space, and a new session's rows land in
	// the first pages, before the rows the first pass ended at.
	execSQL(t, db, `ALTER TABLE processed_messages RESET (fillfactor)`)
	execSQL(t, db, `VACUUM processed_messages`)
	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id, processed_at)
		SELECT 'c', gen_random_uuid(), now() - interval '2 hours' FROM generate_series(1, 30)`)
	require.NoError(t, err)
	require.Equal(t, 30, countSQL(t, db, `SELECT count(*) FROM processed_messages
		WHERE processed_at < now() - interval '1 hour' AND ctid < (SELECT min(ctid) FROM processed_messages WHERE processed_at > now() - interval '1 hour')`),
		"the new old claims are in the first pages")
	n, err = s.PruneClaims(ctx, db.Pool, "c", before, 100)
	require.NoError(t, err)
	require.EqualValues(t, 30, n)
	require.Equal(t, 200, countSQL(t, db, `SELECT count(*) FROM processed_messages`))
}

// A consumer's claims are pruned by one pass at a time: a pass that finds
// another under way (its advisory lock held) leaves the claims to it at
// once, without waiting for it.
func TestPruneClaimsLeavesClaimsToAPassUnderWay(t *testing.T) {
	t.Parallel()
	db, s := claimsDB(t)
	ctx := context.Background()
	execSQL(t, db, `INSERT INTO processed_messages (consumer, message_id, processed_at)
		SELECT 'c', gen_random_uuid(), now() - interval '2 hours' FROM generate_series(1, 50)`)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('oncekit.inbox.prune:"' || $1 || '"'), hashtext('c'))`, db.Schema)
	require.NoError(t, err)

	// A pass that waited for the other would wait until the deadline.
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := s.PruneClaims(pctx, db.Pool, "c", time.Now().Add(-time.Hour), 10)
	require.NoError(t, err)
	require.Zero(t, n, "the pass under way deletes them")
	n, err = s.PruneClaims(pctx, db.Pool, "other", time.Now().Add(-time.Hour), 10)
	require.NoError(t, err, "another consumer's pass is not held up")
	require.NoError(t, tx.Commit(ctx))
	n, err = s.PruneClaims(ctx, db.Pool, "c", time.Now().Add(-time.Hour), 10)
	require.NoError(t, err)
	require.EqualValues(t, 50, n, "once it has ended, the next pass deletes them")
}

func TestConcurrentPruneClaimsPassesDeleteEachClaimOnce(t *testing.T) {
	t.Parallel()
	db, s := claimsDB(t)
	execSQL(t, db, `INSERT INTO processed_messages (consumer, message_id, processed_at)
		SELECT 'c', gen_random_uuid(), now() - interval '2 hours' FROM generate_series(1, 3000)`)
	execSQL(t, db, `INSERT INTO processed_messages (consumer, message_id) SELECT 'c', gen_random_uuid() FROM generate_series(1, 10)`)
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
			n, err := s.PruneClaims(context.Background(), db.Pool, "c", time.Now().Add(-time.Hour), 25)
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
	require.EqualValues(t, 3000, total, "each claim counted by the pass that deleted it")
	require.Equal(t, 10, countSQL(t, db, `SELECT count(*) FROM processed_messages`))
}

// A batch that started at the table's first page read every page the pass
// had already emptied: a pass read on the order of rows²/batch pages. A pass
// now reads a few pages per row it deletes (the row's page when it is found
// and when it is deleted), however many rows it deletes.
func TestPruneClaimsReadsABoundedNumberOfPagesPerRow(t *testing.T) {
	t.Parallel()
	db, s := claimsDB(t)
	ctx := context.Background()
	execSQL(t, db, `INSERT INTO processed_messages (consumer, message_id, processed_at)
		SELECT 'c', gen_random_uuid(), now() - interval '2 hours' FROM generate_series(1, 20000)`)
	execSQL(t, db, `VACUUM ANALYZE processed_messages`)
	// One transaction, so that its own block counts can be read.
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	n, err := s.PruneClaims(ctx, tx, "c", time.Now().Add(-time.Hour), 10)
	require.NoError(t, err)
	require.EqualValues(t, 20000, n)
	var blocks int64
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_stat_get_xact_blocks_fetched('processed_messages'::regclass)`).Scan(&blocks))
	t.Logf("%d heap blocks fetched for %d rows", blocks, n)
	require.Less(t, float64(blocks)/float64(n), 5.0, "heap blocks fetched per row deleted")
}
