package testenv

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

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

// Unsync stops the server at url waiting for synchronous standbys, so that
// a test's cleanup commits with its standby down.
func Unsync(t testing.TB, url string) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Log(err)
		return
	}
	defer conn.Close(ctx)
	for _, sql := range []string{`ALTER SYSTEM SET synchronous_standby_names = ''`, `SELECT pg_reload_conf()`} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Log(err)
		}
	}
}
