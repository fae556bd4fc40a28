package chaos

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// proxied starts a proxy in front of the server of url and returns it with a
// connection config for url that goes through it.
func proxied(t *testing.T, url string) (*PGProxy, *pgx.ConnConfig) {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	proxy, err := NewPGProxy(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	host, port, err := net.SplitHostPort(proxy.Addr())
	require.NoError(t, err)
	p, _ := strconv.Atoi(port)
	cfg.Host, cfg.Port = host, uint16(p)
	cfg.Fallbacks = nil
	return proxy, cfg
}

// assertDrops checks the proxy's drop counts. Conns is not checked exactly:
// pgx sends a CancelRequest on a connection of its own when it abandons one.
func assertDrops(t *testing.T, proxy *PGProxy, drops, commitDrops int64) {
	t.Helper()
	st := proxy.Stats()
	assert.Equal(t, drops, st.Drops, "drops")
	assert.Equal(t, commitDrops, st.CommitDrops, "commit drops")
	assert.GreaterOrEqual(t, st.Conns, int64(1))
}

// ids reads the table's ids straight from the server.
func ids(ctx context.Context, t *testing.T, db *testenv.DB) []int {
	t.Helper()
	rows, err := db.Pool.Query(ctx, "SELECT id FROM paid ORDER BY id")
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	return out
}

// proxiedPaidTable makes a fresh schema with a table paid(id) and a proxy
// in front of its server.
func proxiedPaidTable(ctx context.Context, t *testing.T) (*testenv.DB, *PGProxy, *pgx.ConnConfig) {
	t.Helper()
	db := testenv.NewDB(t)
	_, err := db.Pool.Exec(ctx, "CREATE TABLE paid (id int PRIMARY KEY)")
	require.NoError(t, err)
	proxy, cfg := proxied(t, db.URL)
	return db, proxy, cfg
}

// connect opens a connection with cfg, closed at the test's end.
func connect(ctx context.Context, t *testing.T, cfg *pgx.ConnConfig) *pgx.Conn {
	t.Helper()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// newPool opens a pool of at most four connections with cfg.
func newPool(ctx context.Context, t *testing.T, cfg *pgx.ConnConfig) *pgxpool.Pool {
	t.Helper()
	poolCfg, err := pgxpool.ParseConfig("")
	require.NoError(t, err)
	poolCfg.ConnConfig = cfg
	poolCfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func TestPGProxyCutsAfterCommitReachedTheServer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, proxy, cfg := proxiedPaidTable(ctx, t)
	conn := connect(ctx, t, cfg)

	proxy.SetCommitDropRate(1)
	// Statements outside an explicit COMMIT pass.
	_, err := conn.Exec(ctx, "INSERT INTO paid VALUES ($1)", 1)
	require.NoError(t, err, "an autocommit insert was cut")

	// Tx.Commit sends a simple Query "commit": the client gets an error, the
	// server committed.
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO paid VALUES ($1)", 2)
	require.NoError(t, err)
	require.Error(t, tx.Commit(ctx), "the client learned the outcome of a cut COMMIT")
	assert.True(t, conn.IsClosed())
	assert.Equal(t, []int{1, 2}, ids(ctx, t, db), "the cut COMMIT did not commit on the server")
	assertDrops(t, proxy, 1, 1)

	// A ROLLBACK is never cut.
	tx, err = connect(ctx, t, cfg).Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO paid VALUES ($1)", 3)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	assert.EqualValues(t, 1, proxy.Stats().CommitDrops)
}

func TestPGProxyCutsAtAPipelinedCommit(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, proxy, cfg := proxiedPaidTable(ctx, t)
	conn := connect(ctx, t, cfg)

	// A batch ending in COMMIT, as the idempotency edge sends it: pgx
	// prepares COMMIT (Parse) the first time, then only Binds and Executes
	// the cached statement.
	insertAndCommit := func(id int) error {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		b := &pgx.Batch{}
		b.Queue("INSERT INTO paid VALUES ($1)", id)
		b.Queue("COMMIT")
		return tx.SendBatch(ctx, b).Close()
	}
	require.NoError(t, insertAndCommit(1))
	proxy.SetCommitDropRate(1)
	require.Error(t, insertAndCommit(2), "the client learned the outcome of a cut COMMIT")
	assert.Equal(t, []int{1, 2}, ids(ctx, t, db), "the cut COMMIT did not commit on the server")
	assertDrops(t, proxy, 1, 1)
}

func TestPGProxyDropRandomAndThePoolRecovers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, proxy, cfg := proxiedPaidTable(ctx, t)
	pool := newPool(ctx, t, cfg)
	var err error

	held := make([]*pgxpool.Conn, 2)
	for i := range held {
		held[i], err = pool.Acquire(ctx)
		require.NoError(t, err)
		require.NoError(t, held[i].Ping(ctx))
	}
	assert.Equal(t, 1, proxy.DropRandom(1))
	failed := 0
	for _, c := range held {
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			failed++
		}
	}
	assert.Equal(t, 1, failed, "exactly the dropped connection fails its next query")
	assert.Equal(t, 1, proxy.DropRandom(10), "one live connection was left to cut")
	for _, c := range held {
		_, err := c.Exec(ctx, "SELECT 1")
		assert.Error(t, err)
		c.Release()
	}
	assert.Zero(t, proxy.DropRandom(10))

	// The pool replaces the dead connections with new ones through the proxy.
	require.NoError(t, poll(ctx, func(ctx context.Context) error {
		_, err := pool.Exec(ctx, "INSERT INTO paid VALUES (1) ON CONFLICT DO NOTHING")
		return err
	}))
	assert.Equal(t, []int{1}, ids(ctx, t, db))
	assert.Greater(t, proxy.Stats().Conns, int64(2), "no new connection was made")
	assertDrops(t, proxy, 2, 0)
}

func TestPGProxySurvivesAServerRestart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg := pgcluster.StartForTest(ctx, t, pgcluster.Options{Settings: pgSettings})
	proxy, cfg := proxied(t, pg.URL("postgres"))
	pool := newPool(ctx, t, cfg)
	_, err := pool.Exec(ctx, "CREATE TABLE paid (id int PRIMARY KEY)")
	require.NoError(t, err)

	require.NoError(t, pg.StopImmediate())
	_, err = pool.Exec(ctx, "INSERT INTO paid VALUES (1)")
	require.Error(t, err, "a query succeeded while the server was down")
	require.NoError(t, pg.Start(ctx))
	require.NoError(t, poll(ctx, func(ctx context.Context) error {
		_, err := pool.Exec(ctx, "INSERT INTO paid VALUES (2)")
		return err
	}))
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM paid WHERE id = 2").Scan(&n))
	assert.Equal(t, 1, n)
	assert.GreaterOrEqual(t, proxy.Stats().Conns, int64(2), fmt.Sprintf("%+v", proxy.Stats()))
}
