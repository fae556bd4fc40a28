package pgcluster

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPGSurvivesImmediateStopAndCloseRemovesIt(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	pg := StartForTest(ctx, t, Options{Settings: "fsync = on\nmax_connections = 123\n"})
	t.Logf("initdb and start took %v", time.Since(start).Round(time.Millisecond))
	require.NoError(t, pg.CreateDB(ctx, "data"))

	conn, err := pgx.Connect(ctx, pg.URL("data"))
	require.NoError(t, err)
	var fsync string
	require.NoError(t, conn.QueryRow(ctx, "SHOW fsync").Scan(&fsync))
	assert.Equal(t, "on", fsync)
	var maxConns int
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting('max_connections')::int").Scan(&maxConns))
	assert.Equal(t, 123, maxConns, "the caller's settings were not applied")
	_, err = conn.Exec(ctx, "CREATE TABLE payments (id int PRIMARY KEY)")
	require.NoError(t, err)
	for i := range 100 {
		_, err = conn.Exec(ctx, "INSERT INTO payments VALUES ($1)", i)
		require.NoError(t, err)
	}
	// An open transaction at the crash must vanish.
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO payments VALUES (1000)")
	require.NoError(t, err)

	require.NoError(t, pg.StopImmediate())
	_, err = conn.Exec(ctx, "SELECT 1")
	require.Error(t, err, "the connection outlived an immediate stop")
	_ = conn.Close(ctx)
	_, err = pgx.Connect(ctx, pg.URL("data"))
	require.Error(t, err, "the server accepts connections after an immediate stop")

	start = time.Now()
	require.NoError(t, pg.Start(ctx))
	t.Logf("crash recovery and start took %v", time.Since(start).Round(time.Millisecond))
	conn, err = pgx.Connect(ctx, pg.URL("data"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var n, maxID int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*), max(id) FROM payments").Scan(&n, &maxID))
	assert.Equal(t, 100, n, "committed rows lost in the crash")
	assert.Equal(t, 99, maxID, "an uncommitted row survived the crash")

	log, err := os.ReadFile(pg.LogPath())
	require.NoError(t, err)
	assert.Contains(t, string(log), "automatic recovery in progress", "the restart did not run crash recovery")

	// Close stops the server and removes its data directory.
	conn.Close(ctx)
	pg.Close()
	_, err = os.Stat(pg.base)
	assert.True(t, os.IsNotExist(err), "the data directory is still there: %v", err)
	_, err = pgx.Connect(ctx, pg.URL("postgres"))
	assert.Error(t, err, "the server still answers after Close")
	pg.Close() // twice is fine
}
