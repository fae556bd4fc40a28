package drift_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/drift"
	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// In logical mode drift reads the slot through the outbox: the WAL an
// inactive slot keeps and its lag, each against its limit; a dropped slot
// is drift whatever the figures.
func TestSlotChecksSeeLogicalMode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := pgcluster.StartForTest(ctx, t, pgcluster.Options{Settings: "wal_level = logical\nfsync = off\n"})
	db := testenv.NewDBOn(t, pg.URL("postgres"))
	run := func() drift.Report {
		c, err := drift.New(db.Pool, &drift.Config{Schema: db.Schema, Logger: quiet, MaxInactiveSlotRetainedBytes: 100_000})
		require.NoError(t, err)
		rep, err := c.Run(ctx)
		require.NoError(t, err)
		return rep
	}
	rep := run()
	require.False(t, finding(t, rep, "outbox_slot_lag_bytes").Drift, "no logical mode: nothing to find")
	require.Zero(t, finding(t, rep, "outbox_slot_inactive_retained_bytes").Value)

	ob, err := outbox.New(&outbox.Config{Schema: db.Schema, Logical: true})
	require.NoError(t, err)
	require.NoError(t, ob.SetUpLogical(ctx, db.Pool))
	exec(t, db, `CREATE TABLE filler (n int); INSERT INTO filler SELECT generate_series(1, 10000)`)
	rep = run()
	retained := finding(t, rep, "outbox_slot_inactive_retained_bytes")
	require.True(t, retained.Drift, "an inactive slot keeps %v bytes", retained.Value)
	require.Greater(t, retained.Value, 100_000.0)
	require.Contains(t, retained.Examples[0], "active false")
	lag := finding(t, rep, "outbox_slot_lag_bytes")
	require.Positive(t, lag.Value)
	require.False(t, lag.Drift, "within the default 1 GB")

	exec(t, db, `SELECT pg_drop_replication_slot('oncekit_`+db.Schema+`')`)
	lag = finding(t, run(), "outbox_slot_lag_bytes")
	require.True(t, lag.Drift, "a dropped slot is drift")
	require.Contains(t, lag.Examples[0], "is lost (exists false")
}
