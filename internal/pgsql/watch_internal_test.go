package pgsql

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// A cause that persists is logged again once per interval, with the
// failures since the last line.
func TestWatchLogsAgainAfterTheInterval(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	w := NewWatch(slog.New(slog.NewTextHandler(&buf, nil)), nil)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w.now = func() time.Time { return now }
	err := &pgconn.PgError{Severity: "ERROR", Code: "42703", Message: `column "x" does not exist`}
	for range 10 {
		w.Failed("batch", err)
		now = now.Add(time.Second)
	}
	require.Equal(t, 1, strings.Count(buf.String(), "level=ERROR"))
	now = now.Add(WatchLogInterval)
	w.Failed("batch", err)
	require.Equal(t, 2, strings.Count(buf.String(), "level=ERROR"))
	require.Contains(t, buf.String(), "failures=10 since=2026-01-01T00:00:00Z", "the second line counts the failures since the first")
	require.Contains(t, w.Err().Error(), "batch failing since 2026-01-01T00:00:00Z (11 failures)")

	// A cause that flaps (a success between failures) is not logged again
	// within the interval, nor is its recovery.
	w.OK("batch")
	require.Equal(t, 1, strings.Count(buf.String(), "statement succeeds again"))
	for range 10 {
		w.Failed("batch", err)
		w.OK("batch")
		now = now.Add(time.Second)
	}
	require.Equal(t, 2, strings.Count(buf.String(), "level=ERROR"))
	require.Equal(t, 1, strings.Count(buf.String(), "statement succeeds again"))
	require.NoError(t, w.Err())
}
