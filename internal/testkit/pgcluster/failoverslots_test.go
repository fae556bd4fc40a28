package pgcluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/wait"
)

// failoverSettings are a primary's settings for a standby that keeps its
// logical slots.
const failoverSettings = "wal_level = logical\nmax_replication_slots = 10\nmax_wal_senders = 10\n"

// On PostgreSQL 17 a standby made by FailoverStandby keeps a copy of the
// primary's failover slot (synced, not temporary), and after the primary
// stops and the standby is promoted the slot is there to stream from.
func TestFailoverStandbyKeepsAFailoverSlotOn17(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pg := StartPG17ForTest(ctx, t, Options{Settings: failoverSettings})
	major, err := pg.Major(ctx)
	require.NoError(t, err)
	require.Equal(t, 17, major)
	require.NoError(t, pg.exec(ctx, `SELECT pg_create_logical_replication_slot('app', 'pgoutput', failover => true)`))
	start := time.Now()
	sb, err := pg.FailoverStandby(ctx, "sb1")
	require.NoError(t, err)
	t.Cleanup(sb.Close)
	t.Logf("standby (SQL base backup) made and started in %v", time.Since(start).Round(time.Millisecond))
	conn, err := pgx.Connect(ctx, sb.URL("postgres"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	start = time.Now()
	require.NoError(t, wait.Until(ctx, 100*time.Millisecond, func(ctx context.Context) error {
		var ready bool
		err := conn.QueryRow(ctx, `SELECT coalesce(bool_and(synced AND NOT temporary AND invalidation_reason IS NULL), false)
			FROM pg_replication_slots WHERE slot_name = 'app'`).Scan(&ready)
		if err == nil && !ready {
			// The copy persists once the primary's slot moves past the
			// standby's position.
			err = pg.exec(ctx, `SELECT count(*) FROM pg_logical_slot_get_binary_changes('app', NULL, NULL, 'proto_version', '1', 'publication_names', 'x')`)
			if err == nil {
				err = errNotYet
			}
		}
		return err
	}))
	t.Logf("slot synced to the standby in %v", time.Since(start).Round(time.Millisecond))
	conn.Close(ctx)

	require.NoError(t, pg.StopImmediate())
	start = time.Now()
	require.NoError(t, sb.Promote(ctx))
	t.Logf("promoted in %v", time.Since(start).Round(time.Millisecond))
	conn, err = pgx.Connect(ctx, sb.URL("postgres"))
	require.NoError(t, err)
	var recovery bool
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_is_in_recovery(), (SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'app')`).Scan(&recovery, &n))
	require.False(t, recovery)
	require.Equal(t, 1, n, "the promoted standby has no copy of the failover slot")
	_, err = conn.Exec(ctx, `SELECT count(*) FROM pg_logical_slot_peek_binary_changes('app', NULL, NULL, 'proto_version', '1', 'publication_names', 'x')`)
	require.NoError(t, err, "the promoted standby's slot cannot be decoded from")
}

var errNotYet = errors.New("the standby's copy of the slot is not ready yet")
