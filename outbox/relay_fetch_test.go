package outbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// A batch of a partition whose keys are blocked reads the held rows through
// outbox_blocked once, however many there are: between repartitions the
// check for a held row of an earlier epoch is not made (it scanned the
// outbox once per held row, 186 ms a batch at 1,160 held rows of 9,600:
// the relays' statements then took seconds each on a loaded server, so more
// publishes timed out and more rows were held), and whether the partition
// holds any held row is read from the index, not the table.
func TestRelayFetchReadsHeldRowsThroughIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	// Eight keys, one per partition, 9,600 rows; of each key the last 145
	// rows behind the cursor are held: a retry come due and its followers.
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO outbox (id, txid, partition, ordering_key, subject, payload)
			SELECT gen_random_uuid(), (1000 + g/5)::text::xid8, g % 8, 'k' || (g % 8), 's', '' FROM generate_series(1, 9000) g;
		WITH r AS (SELECT seq, row_number() OVER (PARTITION BY ordering_key ORDER BY seq DESC) AS n FROM outbox)
		UPDATE outbox o SET attempts = (r.n = 145)::int,
			next_attempt_at = CASE WHEN r.n = 145 THEN now() - interval '1 second' ELSE '-infinity' END
			FROM r WHERE r.seq = o.seq AND r.n <= 145;
		UPDATE relay_partitions p SET owner = 'me', token = 1, expires_at = now() + interval '1 hour',
			(cursor_txid, cursor_seq) = (SELECT o.txid, o.seq FROM outbox o WHERE o.partition = p.partition ORDER BY o.txid DESC, o.seq DESC LIMIT 1)
			WHERE p.partition < 8;
		INSERT INTO outbox (id, txid, partition, ordering_key, subject, payload)
			SELECT gen_random_uuid(), (5000 + g/5)::text::xid8, g % 8, 'k' || (g % 8), 's', '' FROM generate_series(1, 600) g;
		ANALYZE outbox; ANALYZE relay_partitions`)
	require.NoError(t, err)

	args := []any{int32(3), "me", int64(1), 1000}
	rows, err := db.Pool.Query(ctx, outbox.FetchSQL(db.Schema), args...)
	require.NoError(t, err)
	retries := 0
	for rows.Next() {
		var retry bool
		require.NoError(t, rows.Scan(append([]any{&retry}, make([]any, len(rows.FieldDescriptions())-1)...)...))
		if retry {
			retries++
		}
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 145, retries, "the due key's held chain")

	plan := testenv.GenericPlan(t, db.Pool, outbox.FetchSQL(db.Schema), args...)
	t.Logf("fetch plan:\n%s", plan)
	testenv.RequireIndexReads(t, "fetch", plan, "outbox")
}

// The probe, run four times a second by every relay, and the look for
// partitions beyond the count read the outbox through outbox_pending
// whatever its size when the plan was made: pgx keeps a statement's plan
// for the connection's life, and a plan made on an empty outbox that
// scanned it whole went on doing so, 75 to 150 pages a probe in a fleet
// run, until the table was next analyzed.
func TestRelayProbeReadsThroughIndexesWhateverTheOutboxSize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	_, err := db.Pool.Exec(ctx, `ALTER TABLE outbox SET (autovacuum_enabled = false)`)
	require.NoError(t, err)
	parts := make([]int32, 16)
	for i := range parts {
		parts[i] = int32(i)
	}
	check := func(when string) {
		plan := testenv.GenericPlan(t, db.Pool, outbox.ProbeSQL(db.Schema), parts, "2990")
		t.Logf("probe plan, %s:\n%s", when, plan)
		testenv.RequireIndexReads(t, "probe, "+when, plan, "outbox")
		plan = testenv.GenericPlan(t, db.Pool, outbox.PartitionsBeyondSQL(db.Schema), 16)
		t.Logf("partitions beyond, %s:\n%s", when, plan)
		testenv.RequireIndexReads(t, "partitions beyond, "+when, plan, "outbox")
	}
	check("empty")
	_, err = db.Pool.Exec(ctx, `
		INSERT INTO outbox (id, txid, partition, subject, payload)
			SELECT gen_random_uuid(), (1000 + g/5)::text::xid8, g % 16, 's', '' FROM generate_series(1, 10000) g`)
	require.NoError(t, err)
	check("10,000 rows, never analyzed")
	_, err = db.Pool.Exec(ctx, `ANALYZE outbox`)
	require.NoError(t, err)
	check("10,000 rows, analyzed")
}
