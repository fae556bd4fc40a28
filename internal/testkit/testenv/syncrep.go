package testenv

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
)

// SyncPair is a primary of the test's own whose commits wait for a
// streaming standby (synchronous_standby_names = '*'), and a database on
// the primary.
type SyncPair struct {
	Primary, Standby *pgcluster.Cluster
	DB               *DB

	stopped atomic.Bool
}

// NewSyncPair starts a primary and its synchronous standby for t, and
// makes a database on the primary. The pooled leg skips t: the pair is not
// behind its pooler.
func NewSyncPair(t testing.TB) *SyncPair {
	t.Helper()
	RequireDirect(t, "runs on a primary and a standby of its own, which the pooled leg does not put behind its pooler")
	ctx := context.Background()
	pg := pgcluster.StartForTest(ctx, t, pgcluster.Options{Settings: "fsync = off\nmax_connections = 100\nsynchronous_standby_names = '*'\n"})
	standby, err := pg.Standby(ctx)
	require.NoError(t, err)
	t.Cleanup(standby.Close)
	return &SyncPair{Primary: pg, Standby: standby, DB: NewDBOn(t, pg.URL("postgres"))}
}

// StopStandby stops the standby (immediate shutdown): the primary's
// commits wait until StartStandby. If t ends with the standby still down,
// t's cleanup starts it first, so that the cleanups registered before,
// which commit, pass.
func (p *SyncPair) StopStandby(t testing.TB) {
	t.Helper()
	require.NoError(t, p.Standby.StopImmediate())
	p.stopped.Store(true)
	t.Cleanup(func() {
		if p.stopped.Load() {
			p.StartStandby(t)
		}
	})
}

// StartStandby starts the standby again; it catches up and the waiting
// commits return.
func (p *SyncPair) StartStandby(t testing.TB) {
	t.Helper()
	require.NoError(t, p.Standby.Start(context.Background()))
	p.stopped.Store(false)
}

// WaitSyncRep waits until a backend that match accepts (by its PID and
// its statement, trimmed) waits for the synchronous standby.
func WaitSyncRep(t testing.TB, pool *pgxpool.Pool, match func(pid int, query string) bool) {
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

// CommitLocally commits tx, whose connection's backend is pid, on the
// primary alone: the commit waits for a synchronous standby that is down,
// and the wait is cancelled (pg_cancel_backend through pool), as pgx does
// when a connection breaks during a COMMIT. The transaction is then
// committed and visible on the primary, and not on the standby.
func CommitLocally(t testing.TB, pool *pgxpool.Pool, tx pgx.Tx, pid int) {
	t.Helper()
	committed := make(chan error, 1)
	go func() { committed <- tx.Commit(context.Background()) }()
	WaitSyncRep(t, pool, func(p int, _ string) bool { return p == pid })
	_, err := pool.Exec(context.Background(), `SELECT pg_cancel_backend($1)`, pid)
	require.NoError(t, err)
	require.NoError(t, <-committed, "a commit whose wait is cancelled commits on the primary")
}
