package outbox_test

import (
	"context"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// The sweep, run every PollInterval instead of waking every worker, names
// the held partitions with work the probe does not see, and only those: a
// row after the cursor, a due retry without a key, the due head of a key
// (an unparked row) with its followers, another key's due head beside a
// blocked key. Not the followers of a parked head or of a head not yet
// due, a retry not yet due, an empty partition, or a partition not held.
func TestRelaySweepNamesOnlyPartitionsWithWork(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	_, err := db.Pool.Exec(ctx, `
		UPDATE relay_partitions SET cursor_txid = '20', cursor_seq = 0; -- rows of txid 10 are behind, 30 after
		INSERT INTO outbox (id, txid, partition, ordering_key, subject, payload, attempts, next_attempt_at, parked_at) VALUES
			(gen_random_uuid(), '30', 1, 'k', 's', '', 0, NULL, NULL),                              -- after the cursor
			(gen_random_uuid(), '10', 2, 'k', 's', '', 10, now(), now()),                           -- parked head
			(gen_random_uuid(), '10', 2, 'k', 's', '', 0, '-infinity', NULL),                       -- its follower
			(gen_random_uuid(), '10', 3, '', 's', '', 1, now() + interval '1 hour', NULL),          -- retry not due
			(gen_random_uuid(), '10', 4, '', 's', '', 1, now() - interval '1 second', NULL),        -- retry due
			(gen_random_uuid(), '10', 5, 'k', 's', '', 10, '-infinity', NULL),                      -- unparked head
			(gen_random_uuid(), '10', 5, 'k', 's', '', 0, '-infinity', NULL),                       -- its follower
			(gen_random_uuid(), '10', 6, 'k', 's', '', 1, now() + interval '1 hour', NULL),         -- head not due
			(gen_random_uuid(), '10', 6, 'k', 's', '', 0, '-infinity', NULL),                       -- its follower
			(gen_random_uuid(), '10', 6, 'j', 's', '', 0, '-infinity', NULL),                       -- another key's due head
			(gen_random_uuid(), '30', 7, '', 's', '', 0, NULL, NULL),                               -- after the cursor, not held
			(gen_random_uuid(), '10', 8, 'k', 's', '', 1, now() + interval '1 hour', NULL),         -- head not due
			(gen_random_uuid(), '10', 8, 'k', 's', '', 0, '-infinity', NULL)                        -- its follower`)
	require.NoError(t, err)
	var named []int32
	require.NoError(t, db.Pool.QueryRow(ctx, outbox.SweepSQL(db.Schema), []int32{0, 1, 2, 3, 4, 5, 6, 8}).Scan(&named))
	slices.Sort(named)
	require.Equal(t, []int32{1, 4, 5, 6}, named)
}

// The sweep reads through the indexes, however many published rows lie
// behind the cursors: it runs every PollInterval on an idle outbox.
func TestRelaySweepReadsThroughIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	_, err := db.Pool.Exec(ctx, `
		UPDATE relay_partitions SET cursor_txid = '20', cursor_seq = 0;
		INSERT INTO outbox (id, txid, partition, subject, payload)
			SELECT gen_random_uuid(), '10', g % 16, 's', '' FROM generate_series(1, 50000) g;
		INSERT INTO outbox (id, txid, partition, ordering_key, subject, payload, attempts, next_attempt_at, parked_at)
			SELECT gen_random_uuid(), '10', g % 16, 'k' || g, 's', '', 10, now(), now() FROM generate_series(1, 2000) g;
		ANALYZE outbox`)
	require.NoError(t, err)
	held := make([]int32, 16)
	for i := range held {
		held[i] = int32(i)
	}
	plan := testenv.GenericPlan(t, db.Pool, outbox.SweepSQL(db.Schema), held)
	t.Logf("sweep plan:\n%s", plan)
	testenv.RequireIndexReads(t, "sweep", plan, "outbox")
}
