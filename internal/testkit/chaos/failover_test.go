package chaos

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
)

// A failover moves the address to the promoted standby and cuts what it
// held; the data committed before it is there; the old primary's
// processes are gone (fenced), and a new standby streams. With the
// standby stopped, a failover in sync mode is refused and kills nothing:
// a standby that may lack acknowledged commits is never promoted.
func TestFailoverPromotesOnlyAStandbyInSync(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three PostgreSQL servers")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o755))
	pg, err := pgcluster.Start(ctx, pgcluster.Options{LogDir: dir, Settings: pgSettings + syncSettings})
	if errors.Is(err, pgcluster.ErrNoPostgres) {
		t.Skip("PostgreSQL server binaries are not installed")
	}
	require.NoError(t, err)
	topo, err := NewTopology(ctx, pg, true, SlotSync{})
	if err != nil {
		pg.Close()
	}
	require.NoError(t, err)
	t.Cleanup(topo.Close)
	addr, err := NewPGProxy(pg.Addr())
	require.NoError(t, err)
	t.Cleanup(addr.Close)
	topo.Follow(addr)
	url := "postgres://postgres@" + addr.Addr() + "/postgres?sslmode=disable"

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `CREATE TABLE facts (n int); INSERT INTO facts VALUES (1)`)
	require.NoError(t, err)

	old := topo.Primary()
	rec, err := topo.Failover(ctx)
	require.NoError(t, err)
	require.NotSame(t, old, topo.Primary(), "the standby was promoted")
	t.Logf("failover: cut %s, %d bytes behind, serving %s after the cut, new standby in %s", rec.Cut, rec.Behind, rec.Down, rec.Rebuilt)
	require.Error(t, conn.Ping(ctx), "the connection to the old primary was cut")
	conn, err = pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM facts`).Scan(&n))
	require.Equal(t, 1, n, "a synchronous commit survives the failover")
	var inRecovery bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery))
	require.False(t, inRecovery, "the address leads to a primary")
	r, err := topo.Primary().Replica(ctx)
	require.NoError(t, err)
	require.Equal(t, "sync", r.SyncState, "a new standby streams in sync")

	// A standby out of sync is not promoted: the failover is refused and
	// the primary keeps serving.
	topo.mu.Lock()
	standby := topo.standby
	topo.mu.Unlock()
	require.NoError(t, standby.StopImmediate())
	primary := topo.Primary()
	_, err = topo.Failover(ctx)
	require.ErrorIs(t, err, errNotInSync)
	require.Same(t, primary, topo.Primary())
	_, refused := topo.Records()
	require.Len(t, refused, 1)
	require.NoError(t, conn.QueryRow(ctx, `SELECT 1`).Scan(&n), "the primary still serves")
}
