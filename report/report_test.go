package report_test

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/report"
)

// read reads db's report in a read-only, repeatable-read transaction, as
// the console and `oncekit status` do.
func read(t *testing.T, db *testenv.DB) report.Status {
	t.Helper()
	var rep report.Status
	err := pgx.BeginTxFunc(context.Background(), db.Pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(tx pgx.Tx) error {
			var err error
			rep, err = report.Read(context.Background(), tx, db.Schema, "", time.Minute, time.Hour)
			return err
		})
	require.NoError(t, err)
	return rep
}

// addEffects records n effects of kind in state, due at due.
func addEffects(t *testing.T, db *testenv.DB, kind, state, due string, n int) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), `
		INSERT INTO side_effects (source_id, kind, idempotency_key, state, next_attempt_at)
		SELECT $1 || '-' || $2 || '-' || g, $1, $1 || '-' || $2 || '-' || g, $2, $3::timestamptz
		FROM generate_series(1, $4) g`, kind, state, due, n)
	require.NoError(t, err)
}

func TestLiveEffectsCountedUpToTheCap(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	addEffects(t, db, "order.paid", "pending", "-infinity", 5)
	addEffects(t, db, "order.paid", "unknown", "infinity", 2)
	rep := read(t, db)
	require.False(t, rep.EffectsCapped)
	require.Equal(t, []report.Effects{{Kind: "order.paid", Pending: 5, Overdue: 5, Unknown: 2}}, rep.Effects)

	// An outage leaves more effects pending than the cap: the count stops
	// there, says so, and the unknown effects (due last) are still counted.
	addEffects(t, db, "email.receipt", "pending", "now", report.LiveCap)
	rep = read(t, db)
	require.True(t, rep.EffectsCapped)
	var due, unknown int64
	for _, e := range rep.Effects {
		due += e.Pending + e.Fired
		unknown += e.Unknown
	}
	require.Equal(t, int64(report.LiveCap), due, "due effects counted up to the cap")
	require.Equal(t, int64(2), unknown, "unknown effects counted beside a capped count of due ones")
	require.Equal(t, int64(5), rep.Effects[1].Overdue, "the earliest due are counted first: %+v", rep.Effects)
}

// lossy finds the heap pages a BRIN index could not rule out.
var lossy = regexp.MustCompile(`Heap Blocks: lossy=(\d+)`)

// TestReportReadsThroughIndexes runs every statement of the report, as
// Read sent it, under EXPLAIN ANALYZE with a generic plan (as pgx runs it
// once prepared) on 20,000 rows of each large table: none may read one of
// them whole, nor throw away 1,000 rows or more it read. A BRIN index
// (the recent claims and effects) rules out what it has summarized: the
// range its bound falls in and the newest, which VACUUM leaves
// unsummarized until it is full, two ranges of 128 pages at most.
func TestReportReadsThroughIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO idempotency_keys (tenant, operation, key, fingerprint, state, status_code, expires_at)
			SELECT '', 'pay', md5(g::text), '\x00', 'completed', 201, now() + interval '1 day' FROM generate_series(1, 20000) g;
		INSERT INTO outbox (id, partition, ordering_key, subject, payload)
			SELECT gen_random_uuid(), g % 8, 'k' || (g % 500), 'a.b', '' FROM generate_series(1, 20000) g;
		INSERT INTO processed_messages (consumer, message_id, processed_at)
			SELECT 'c', gen_random_uuid(), now() - interval '2 days' FROM generate_series(1, 20000) g;
		INSERT INTO dead_letters (consumer, message_id, subject, payload, reason, attempts, replayed_at)
			SELECT 'c', gen_random_uuid()::text, 'a.b', '', 'err ' || g, 5, now() FROM generate_series(1, 20000) g;
		INSERT INTO side_effects (source_id, kind, idempotency_key, state, next_attempt_at, created_at)
			SELECT 's' || g, 'mail', md5('e' || g), 'confirmed', NULL, now() - interval '2 days' FROM generate_series(1, 20000) g`)
	require.NoError(t, err)
	// As autovacuum leaves them: analyzed, the BRIN ranges summarized.
	_, err = db.Pool.Exec(ctx, `VACUUM ANALYZE`)
	require.NoError(t, err)
	var log testenv.StatementLog
	traced := &testenv.DB{Pool: db.TracedPool(t, &log), Schema: db.Schema}
	read(t, traced)
	stmts := log.Matching("")
	require.Greater(t, len(stmts), 5)
	for _, s := range stmts {
		if !strings.HasPrefix(strings.TrimSpace(s.SQL), "SELECT") && !strings.HasPrefix(strings.TrimSpace(s.SQL), "WITH") {
			continue // begin, commit
		}
		plan := testenv.GenericPlan(t, db.Pool, s.SQL, s.Args...)
		testenv.RequireIndexReads(t, s.SQL, plan, "outbox", "processed_messages", "dead_letters", "side_effects", "idempotency_keys")
		for _, m := range lossy.FindAllStringSubmatch(plan, -1) {
			n, _ := strconv.Atoi(m[1])
			require.LessOrEqual(t, n, 2*128, s.SQL+"\n"+plan)
		}
	}
}

// addSettled records n effects of kind in state (confirmed or failed),
// recorded ago.
func addSettled(t *testing.T, db *testenv.DB, kind, state string, ago time.Duration, n int) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), `
		INSERT INTO side_effects (source_id, kind, idempotency_key, state, next_attempt_at, created_at)
		SELECT k, $1::text, k, $2::text, NULL, now() - make_interval(secs => $3::float8)
		FROM generate_series(1, $4) g, LATERAL (SELECT concat_ws('-', $1::text, $2::text, g, $3::float8) AS k) k`, kind, state, ago.Seconds(), n)
	require.NoError(t, err)
}

func TestSettledEffectsCountedWithinTheRecentWindow(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	addSettled(t, db, "order.paid", "confirmed", 3*time.Hour, 40)
	addSettled(t, db, "order.paid", "failed", 2*time.Hour, 4)
	addSettled(t, db, "order.paid", "confirmed", 10*time.Minute, 3)
	addSettled(t, db, "order.paid", "failed", time.Minute, 2)
	rep := read(t, db) // the window: the last hour
	require.False(t, rep.EffectsCapped)
	require.Equal(t, []report.Effects{{Kind: "order.paid", Confirmed: 3, Failed: 2}}, rep.Effects)

	// More recorded within the window than the cap: the newest are counted,
	// and the report says so.
	addSettled(t, db, "order.paid", "confirmed", 0, report.LiveCap)
	rep = read(t, db)
	require.True(t, rep.EffectsCapped)
	require.Equal(t, []report.Effects{{Kind: "order.paid", Confirmed: report.LiveCap}}, rep.Effects)
}

// Read plans its own statements generically and leaves the transaction's
// later statements (the console's lists) to the mode it found.
func TestReadLeavesThePlanModeAsItFoundIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = force_custom_plan"); err != nil {
			return err
		}
		if _, err := report.Read(ctx, tx, db.Schema, "", time.Minute, time.Hour); err != nil {
			return err
		}
		var mode string
		require.NoError(t, tx.QueryRow(ctx, "SELECT current_setting('plan_cache_mode')").Scan(&mode))
		require.Equal(t, "force_custom_plan", mode)
		return nil
	}))
}

// In logical mode the events live in the WAL: a slot that stopped moving
// shows its lag and the WAL it keeps, though the outbox table is empty; a
// dropped slot shows lost. A schema without logical mode shows no slot.
func TestReportShowsTheLogicalSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	require.Nil(t, read(t, testenv.NewDB(t)).Outbox.Slot, "no logical mode, no slot")

	pg := pgcluster.StartForTest(ctx, t, pgcluster.Options{Settings: "wal_level = logical\nfsync = off\n"})
	db := testenv.NewDBOn(t, pg.URL("postgres"))
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema, Logical: true})
	require.NoError(t, err)
	require.NoError(t, ob.SetUpLogical(ctx, db.Pool))
	_, err = db.Pool.Exec(ctx, `CREATE TABLE filler (n int); INSERT INTO filler SELECT generate_series(1, 10000)`)
	require.NoError(t, err)

	rep := read(t, db)
	require.Zero(t, rep.Outbox.Backlog, "the table holds nothing")
	s := rep.Outbox.Slot
	require.NotNil(t, s, "logical mode is seen")
	require.Equal(t, "oncekit_"+db.Schema, s.Name)
	require.True(t, s.Exists && !s.Active && !s.Lost, "%+v", s)
	require.Positive(t, s.LagBytes, "the slot that stopped moving is behind")
	require.GreaterOrEqual(t, s.RetainedBytes, s.LagBytes)
	require.True(t, s.Behind())
	t.Logf("slot: %+v", *s)

	_, err = db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, s.Name)
	require.NoError(t, err)
	s = read(t, db).Outbox.Slot
	require.NotNil(t, s)
	require.True(t, s.Lost && !s.Exists && s.Behind(), "a dropped slot is lost: %+v", s)
}
