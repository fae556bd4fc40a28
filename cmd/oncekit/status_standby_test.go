package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/report"
)

// With --standby-url the slot's line says whether the standby's copy of
// the slot would survive a failover: ready once the PostgreSQL 17 standby
// synced it; a server whose slot is not a synced copy (here the primary
// itself) is not.
func TestStatusShowsTheStandbysCopyOfTheSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := pgcluster.StartPG17ForTest(ctx, t, pgcluster.Options{Settings: "wal_level = logical\nfsync = off\n"})
	db := testenv.NewDBOn(t, pg.URL("postgres"))
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema, Logical: true})
	require.NoError(t, err)
	require.NoError(t, ob.SetUpLogical(ctx, db.Pool))
	standby, err := pg.FailoverStandby(ctx, "status_standby")
	require.NoError(t, err)
	t.Cleanup(standby.Close)

	code, out, stderr := cli(t, dbVars(db), "status", "--standby-url", pg.URL("postgres"))
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "standby's copy NOT SYNCED (PostgreSQL 17, sync_replication_slots): a failover loses the slot !")

	slot := "oncekit_" + db.Schema
	require.Eventually(t, func() bool {
		// The copy persists once the primary's slot moves past the
		// standby's position; no relay moves it here.
		_, err := db.Pool.Exec(ctx, `SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())`, slot)
		require.NoError(t, err)
		code, out, stderr = cli(t, dbVars(db), "status", "--json", "--standby-url", standby.URL("postgres"))
		require.Equal(t, 0, code, stderr)
		var rep report.Status
		require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
		return rep.Outbox.Slot.Standby != nil && rep.Outbox.Slot.Standby.Ready
	}, 60*time.Second, 200*time.Millisecond, "the standby's copy gets ready")
	code, out, stderr = cli(t, dbVars(db), "status", "--standby-url", standby.URL("postgres"))
	require.Equal(t, 0, code, stderr)
	t.Logf("status:\n%s", out)
	require.Regexp(t, `standby's copy ready, [0-9.]+ (B|[KMG]iB) behind`, out)
}
