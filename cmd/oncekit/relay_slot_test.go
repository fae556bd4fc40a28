package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// `relay --logical` on a schema whose slot was dropped (its record in
// logical_slots left without it) exits 1 with the error that names the slot and what to
// do, and makes no new slot.
func TestRelayLogicalExitsOnALostSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := pgcluster.StartForTest(ctx, t, pgcluster.Options{Settings: "wal_level = logical\nfsync = off\n"})
	db := testenv.NewDBOn(t, pg.URL("postgres"))
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema, Logical: true})
	require.NoError(t, err)
	require.NoError(t, ob.SetUpLogical(ctx, db.Pool))
	slot := "oncekit_" + db.Schema
	_, err = db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
	require.NoError(t, err)

	nats := testenv.NewNATS(t)
	vars := dbVars(db)
	vars["NATS_URL"] = nats.URL
	name := testenv.Name(t)
	code, _, stderr := cli(t, vars, "relay", "--logical", "--listen", "", "--stream", name, "--subjects", name+".>")
	t.Logf("exit %d, stderr:\n%s", code, stderr)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, `outbox: the logical relay's replication slot is lost: replication slot "`+slot+`" was dropped`)
	require.Contains(t, stderr, "DELETE FROM logical_slots WHERE slot = '"+slot+"'")
	s, err := ob.SlotStatus(ctx, db.Pool)
	require.NoError(t, err)
	require.False(t, s.Exists, "no new slot")
}
