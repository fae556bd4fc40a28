package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/pgcluster"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// A row can be visible on a primary before its synchronous standby has it:
// a commit whose wait for the standby is cancelled (by pgx itself, when a
// connection breaks or a context ends during the COMMIT) is committed
// locally. Published then, it is a phantom once a failover erases it. The
// relay publishes only what the standby has: it reads, waits in its
// barrier's commit for the standby, and publishes after.
func TestRelayPublishesOnlyWhatTheSynchronousStandbyHas(t *testing.T) {
	ctx := context.Background()
	pg := pgcluster.StartForTest(ctx, t, pgcluster.Options{Settings: "fsync = off\nmax_connections = 100\nsynchronous_standby_names = '*'\n"})
	standby, err := pg.Standby(ctx)
	require.NoError(t, err)
	t.Cleanup(standby.Close)
	b := setupDB(t, testenv.NewDBOn(t, pg.URL("postgres")))
	t.Cleanup(func() { unsync(t, pg) }) // first: let the cleanup's own commits through
	pub, _ := publisher(t, b.nats.URL)

	// The relay runs, its leases long enough to outlast the test: once the
	// standby stops, its renewals wait, and it must still publish nothing
	// the standby lacks.
	r, err := outbox.NewRelay(b.db.Pool, b.ob, pub, &outbox.RelayConfig{Lease: time.Minute, PollInterval: 50 * time.Millisecond,
		BatchSize: 50, Logger: testLogger()})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	enqueue := func() (pid int, committed chan error) {
		tx, err := b.db.Pool.Begin(ctx)
		require.NoError(t, err)
		_, err = b.ob.Enqueue(ctx, tx, broker.Message{ID: uuid.New(), Subject: b.subject + ".a", Key: "k", Payload: []byte("x")})
		require.NoError(t, err)
		require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
		committed = make(chan error, 1)
		go func() { committed <- tx.Commit(ctx) }()
		return pid, committed
	}
	_, committed := enqueue()
	require.NoError(t, <-committed)
	waitCount(t, b.stream, 1, 30*time.Second) // the relay holds its partitions

	require.NoError(t, standby.StopImmediate())
	pid, committed := enqueue()
	waitSyncRep(t, b.db.Pool, func(p int, query string) bool { return p == pid })
	_, err = b.db.Pool.Exec(ctx, `SELECT pg_cancel_backend($1)`, pid)
	require.NoError(t, err)
	require.NoError(t, <-committed, "a commit whose wait is cancelled commits on the primary")
	var visible int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&visible))
	require.Equal(t, 2, visible, "the row is visible on the primary")

	// The relay has read the row and waits, in its barrier's commit, for
	// the standby.
	waitSyncRep(t, b.db.Pool, func(p int, query string) bool { return p != pid && strings.EqualFold(query, "commit") })
	require.Equal(t, uint64(1), streamCount(t, b.stream), "published a row its synchronous standby does not have")

	require.NoError(t, standby.Start(ctx))
	waitCount(t, b.stream, 2, 30*time.Second)
}

// waitSyncRep waits until a backend that match accepts (by its PID and
// statement) waits for the
// synchronous standby.
func waitSyncRep(t *testing.T, pool *pgxpool.Pool, match func(pid int, query string) bool) {
	t.Helper()
	require.Eventually(t, func() bool {
		rows, err := pool.Query(context.Background(), `SELECT pid, query FROM pg_stat_activity WHERE wait_event = 'SyncRep'`)
		if err != nil {
			return false
		}
		var pid int
		var query string
		found := false
		_, err = pgx.ForEachRow(rows, []any{&pid, &query}, func() error {
			found = found || match(pid, strings.TrimSpace(query))
			return nil
		})
		return err == nil && found
	}, 30*time.Second, 20*time.Millisecond, "no backend waits for the synchronous standby")
}

// unsync stops pg waiting for a standby, for the cleanup's commits.
func unsync(t *testing.T, pg *pgcluster.Cluster) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Log(err)
		return
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = ''`); err != nil {
		t.Log(err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		t.Log(err)
	}
}
