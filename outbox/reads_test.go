package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// Unpublished knows the schema's mode: rows behind the cursors in table
// mode; in logical mode no row backlog, and a slot that stopped moving is
// behind though the table is empty (Backlog alone says nothing is).
func TestUnpublishedKnowsTheMode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := pgcluster.StartForTest(ctx, t, pgcluster.Options{Settings: "wal_level = logical\nfsync = off\n"})
	db := testenv.NewDBOn(t, pg.URL("postgres"))
	table, err := outbox.New(&outbox.Config{Schema: db.Schema})
	require.NoError(t, err)

	u, err := table.Unpublished(ctx, db.Pool)
	require.NoError(t, err)
	require.False(t, u.Logical, "no slot, no publication: table mode")
	require.False(t, u.Behind())

	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := table.Enqueue(ctx, tx, broker.Message{ID: uuid.New(), Subject: "orders.created"},
			broker.Message{ID: uuid.New(), Subject: "orders.created"})
		return err
	}))
	u, err = table.UnpublishedByPartition(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, int64(2), u.Rows.Pending)
	require.NotEmpty(t, u.Partitions)
	require.True(t, u.Behind())
	b, err := table.Backlog(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, b.Pending, u.Rows.Pending, "by partition, summed, is Backlog")
	_, err = db.Pool.Exec(ctx, `DELETE FROM outbox`)
	require.NoError(t, err)

	logical, err := outbox.New(&outbox.Config{Schema: db.Schema, Logical: true})
	require.NoError(t, err)
	require.NoError(t, logical.SetUpLogical(ctx, db.Pool))
	_, err = db.Pool.Exec(ctx, `CREATE TABLE filler (n int); INSERT INTO filler SELECT generate_series(1, 10000)`)
	require.NoError(t, err)
	for _, ob := range []*outbox.Outbox{table, logical} { // the mode is the schema's, whatever the Config says
		u, err = ob.Unpublished(ctx, db.Pool)
		require.NoError(t, err)
		require.True(t, u.Logical)
		require.Zero(t, u.Rows.Pending, "the events are WAL messages")
		require.True(t, u.Slot.Exists)
		require.Positive(t, u.Slot.LagBytes)
		require.True(t, u.Behind(), "the slot stopped moving: %+v", u.Slot)
	}
	_, err = db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, u.Slot.Name)
	require.NoError(t, err)
	u, err = table.Unpublished(ctx, db.Pool)
	require.NoError(t, err)
	s, err := table.SlotStatus(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, s.SetUp, u.Logical, "the mode is SlotStatus.SetUp")
	require.True(t, u.Logical && u.Slot.Lost && u.Behind(), "a dropped slot is still logical mode, and lost: %+v", u.Slot)
}

func TestUnpublishedOldestAgeIsTheSlotsLagInLogicalMode(t *testing.T) {
	t.Parallel()
	lag := 90.0
	for _, c := range []struct {
		name string
		u    outbox.Unpublished
		want time.Duration
	}{
		{"table mode", outbox.Unpublished{Rows: outbox.Backlog{Pending: 1, OldestAge: 5 * time.Second},
			Slot: outbox.SlotStatus{LagSeconds: &lag}}, 5 * time.Second},
		{"logical, lag known", outbox.Unpublished{Logical: true, Slot: outbox.SlotStatus{LagSeconds: &lag}}, 90 * time.Second},
		{"logical, rows older", outbox.Unpublished{Logical: true, Rows: outbox.Backlog{Pending: 1, OldestAge: 2 * time.Minute},
			Slot: outbox.SlotStatus{LagSeconds: &lag}}, 2 * time.Minute},
		{"logical, lag unknown", outbox.Unpublished{Logical: true}, 0},
	} {
		require.Equal(t, c.want, c.u.OldestAge(), c.name)
	}
}
