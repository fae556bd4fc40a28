package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
)

// The run's pooler leg: daemons → PgBouncer (transaction mode) → the chaos
// proxy → PostgreSQL. The proxy's faults must still mean something through
// PgBouncer: a COMMIT cut on PgBouncer's server connection reaches the
// client as an error while the server committed (an unknown outcome, as
// without a pooler), and PgBouncer serves again after PostgreSQL crashed,
// in both query execution modes the daemons use.
func TestPgBouncerInFrontOfTheProxyPassesItsFaults(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg := pgcluster.StartForTest(ctx, t, pgcluster.Options{Settings: pgSettings})
	direct := pg.URL("postgres")
	proxy, err := NewPGProxy(pg.Addr())
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	dir, err := os.MkdirTemp("", "oncekit-chaos-pooler-") // not t.TempDir: the postgres user must reach it
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	b, err := StartPgBouncer(ctx, filepath.Join(dir, "pgbouncer"), proxy.Addr())
	require.NoError(t, err)
	t.Cleanup(b.Close)

	// onServer runs sql on a direct connection of its own (PostgreSQL
	// crashes mid-test) and scans its one value, if any, into dst.
	onServer := func(sql string, dst ...any) {
		conn, err := pgx.Connect(ctx, direct)
		require.NoError(t, err)
		defer conn.Close(ctx)
		if len(dst) == 0 {
			_, err = conn.Exec(ctx, sql)
		} else {
			err = conn.QueryRow(ctx, sql).Scan(dst...)
		}
		require.NoError(t, err)
	}
	onServer("CREATE TABLE paid (id int PRIMARY KEY)")
	count := func(id int) int {
		var n int
		onServer(fmt.Sprintf("SELECT count(*) FROM paid WHERE id = %d", id), &n)
		return n
	}

	urls, err := roleURLs(ctx, b, direct, "proxied", "", []string{"api-1", "api-2", "provider"})
	require.NoError(t, err, "roleURLs checks that both modes go through a pooler")
	assert.Contains(t, urls["api-1"], "default_query_exec_mode=exec")
	assert.Contains(t, urls["api-2"], "default_query_exec_mode=cache_describe")
	assert.True(t, strings.Contains(urls["api-1"], b.Addr()))
	logical, err := roleURLs(ctx, b, direct, "proxied", "logical", []string{"relay-1", "api-1"})
	require.NoError(t, err)
	assert.Equal(t, "proxied", logical["relay-1"], "the logical relay needs a session of its own")
	assert.Equal(t, urls["api-1"], logical["api-1"])
	require.Error(t, checkPooled(ctx, direct), "a direct connection passed for a pooled one")
	assert.Regexp(t, `^postgres: cl_active=\d+ cl_waiting=0 maxwait=0s sv_active=\d+ sv_idle=\d+ sv_used=\d+ sv_login=\d+$`, b.Pools(ctx))

	for i, name := range []string{"api-1", "api-2"} {
		conn, err := pgx.Connect(ctx, urls[name])
		require.NoError(t, err)
		id := 10 * (i + 1)

		// A COMMIT cut between PgBouncer and PostgreSQL: the client gets
		// an error, the server committed.
		proxy.SetCommitDropRate(1)
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "INSERT INTO paid VALUES ($1)", id)
		require.NoError(t, err)
		require.Error(t, tx.Commit(ctx), "%s: the client learned the outcome of a cut COMMIT", name)
		proxy.SetCommitDropRate(0)
		assert.Equal(t, 1, count(id), "%s: the cut COMMIT did not commit on the server", name)
		conn.Close(ctx)
	}
	assert.EqualValues(t, 2, proxy.Stats().CommitDrops)

	// PostgreSQL crashes; PgBouncer connects again once it is back.
	require.NoError(t, pg.StopImmediate())
	require.NoError(t, pg.Start(ctx))
	require.NoError(t, b.waitServing(ctx, direct))
	for i, name := range []string{"api-1", "api-2"} {
		id := 100 + i
		require.NoError(t, poll(ctx, func(ctx context.Context) error {
			conn, err := pgx.Connect(ctx, urls[name])
			if err != nil {
				return err
			}
			defer conn.Close(ctx)
			_, err = conn.Exec(ctx, "INSERT INTO paid VALUES ($1) ON CONFLICT DO NOTHING", id)
			return err
		}))
		assert.Equal(t, 1, count(id))
	}
	assert.False(t, b.Exited())
}

func TestRunRefusesAnUnknownPoolerAndNamesItsPooler(t *testing.T) {
	_, err := Run(context.Background(), Options{Pooler: "pgpool", Duration: time.Second})
	require.ErrorContains(t, err, `no pooler "pgpool" (there are none, pgbouncer)`)

	res := &Result{Verdict: &Verdict{}}
	assert.Contains(t, res.Line(), " pooler=none failover=none verdict=")
	res.Pooler = "pgbouncer"
	assert.Contains(t, res.Line(), " pooler=pgbouncer failover=none verdict=")
}

// Failover options that cannot make a run are refused before anything
// starts, each with what to do.
func TestRunRefusesFailoverOptionsThatCannotRun(t *testing.T) {
	for _, tc := range []struct {
		opt  Options
		want string
	}{
		{Options{Failover: "semi"}, `no failover "semi" (there are sync, async)`},
		{Options{Failover: "sync", PG: "16"}, `no PostgreSQL "16"`},
		{Options{Failover: "sync", Relay: "logical"}, "only on PostgreSQL 17 (failover slots): add PG=17"},
		{Options{Broken: "claim-commit-local"}, "run it with failovers in sync mode"},
		{Options{Broken: "claim-commit-local", Failover: "async"}, "run it with failovers in sync mode"},
	} {
		tc.opt.Duration = time.Second
		_, err := Run(context.Background(), tc.opt)
		require.ErrorContains(t, err, tc.want, "%+v", tc.opt)
	}
	res := &Result{Verdict: &Verdict{}, Failover: "async", Failovers: 4, Replay: "replay: seen=10 applied=2 absorbed=8",
		FailoverRecords: []FailoverRecord{{Behind: 100, Cut: time.Second}, {Behind: 300}}}
	for _, want := range []string{" failovers=4 ", " failover_behind_max_bytes=300 ", " failover_behind_sum_bytes=400 ",
		" failover_cut_max_ms=1000 ", " replay_applied=2 ", " failover=async verdict="} {
		assert.Contains(t, res.Line(), want)
	}
}

// PgBouncer that dies (SIGKILL here; an assertion of its own in a run) is
// started again on its address, as systemd would, and counted.
func TestPgBouncerThatDiesIsStartedAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "oncekit-chaos-pooler-") // not t.TempDir: the postgres user must reach it
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	b, err := StartPgBouncer(ctx, filepath.Join(dir, "pgbouncer"), "127.0.0.1:5432")
	require.NoError(t, err)
	t.Cleanup(b.Close)
	url, err := b.URL("postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "exec")
	require.NoError(t, err)
	serves := func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "SELECT 1")
		return err
	}
	require.NoError(t, serves(ctx))

	b.mu.Lock()
	pgid := b.pgid
	b.mu.Unlock()
	require.NoError(t, syscall.Kill(-pgid, syscall.SIGKILL))
	require.NoError(t, poll(ctx, func(ctx context.Context) error {
		if b.Restarts() != 1 {
			return fmt.Errorf("restarts %d", b.Restarts())
		}
		return serves(ctx)
	}))
	require.False(t, b.Exited())
	b.Close()
	require.Eventually(t, b.Exited, 10*time.Second, 10*time.Millisecond, "closed, it is not started again")
	require.Equal(t, 1, b.Restarts())
}
