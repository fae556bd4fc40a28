package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// logicalPooledSetup is logicalSetup with the test's pool going through a
// PgBouncer (transaction pooling) in front of the logical cluster; it
// returns the bundle and the cluster's direct URL.
func logicalPooledSetup(t *testing.T) (*bundle, string) {
	t.Helper()
	logicalSetup(t) // starts the logical cluster once (its own schema is unused)
	direct := logicalCluster.pg.URL("postgres")
	pb := testenv.StartPgBouncer(t, direct)
	db := testenv.NewDBOn(t, pb.URL)
	require.True(t, testenv.Pooled(t, db.URL))
	b := setupDB(t, db)
	b.ob = newOutbox(t, b.db, outbox.Config{Logical: true})
	// The slot's set-up is plain SQL: it passes the pooler.
	require.NoError(t, b.ob.SetUpLogical(context.Background(), b.db.Pool))
	t.Cleanup(func() {
		_, _ = b.db.Pool.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
			WHERE slot_name = $1 AND NOT active`, "oncekit_"+b.db.Schema)
	})
	return b, direct
}

// Given a pool through a pooler and no ReplicationURL, the logical relay
// takes no lease and streams nothing: Run returns a *PooledError at once
// (not a stream retried for ever, nor a session lock left on a server
// connection the pooler hands the next client), which names what to do.
func TestLogicalRelayRefusesAPooledPoolWithoutReplicationURL(t *testing.T) {
	t.Parallel()
	b, _ := logicalPooledSetup(t)
	pub, _ := publisher(t, b.nats.URL)
	logs := &testenv.SyncBuffer{}
	r, err := outbox.NewLogicalRelay(b.db.Pool, b.ob, pub, &outbox.LogicalRelayConfig{
		Logger: slog.New(slog.NewTextHandler(logs, nil)), MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = r.Run(ctx)
	require.NoError(t, ctx.Err(), "Run returned before its deadline")
	t.Logf("Run: %v", err)
	require.ErrorIs(t, err, outbox.ErrPooled)
	require.ErrorIs(t, err, pgsql.ErrPooled)
	var pe *outbox.PooledError
	require.True(t, errors.As(err, &pe), "%T", err)
	require.Equal(t, outbox.PooledLease, pe.Conn)
	require.Contains(t, err.Error(), "the logical relay's lease connection found one (the server process behind it is not the one it announced), and its lease (a session advisory lock) would outlive the transaction")
	require.Contains(t, err.Error(), "Give the relay a connection string to the server itself, not to the pooler (LogicalRelayConfig.ReplicationURL; oncekit relay --replication-url or ONCEKIT_REPLICATION_URL)")
	require.NotContains(t, logs.String(), "lease taken")
	var locks int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid::bigint = hashtextextended($1, 0)::int8 & x'ffffffff'::bigint`,
		"oncekit.logical_relay.oncekit_"+b.db.Schema).Scan(&locks))
	require.Zero(t, locks, "no lease is left on a server connection")
}

// A replication connection to a pooler is refused by it (PgBouncer:
// "unsupported startup parameter: replication"); the relay's connect
// turns that into a *PooledError naming the replication connection. To
// the server itself it connects, and the check (pg_backend_pid() in the
// simple protocol, which a replication connection runs) passes.
func TestLogicalRelayReplicationConnectionRefusesAPooler(t *testing.T) {
	t.Parallel()
	b, direct := logicalPooledSetup(t)
	ctx := context.Background()
	_, err := outbox.ConnectReplication(ctx, b.db.URL)
	t.Logf("through PgBouncer: %v", err)
	var pe *outbox.PooledError
	require.True(t, errors.As(err, &pe), "%T: %v", err, err)
	require.Equal(t, outbox.PooledReplication, pe.Conn)
	require.ErrorIs(t, err, outbox.ErrPooled)
	require.Contains(t, err.Error(), "the logical relay's replication connection found one (FATAL: unsupported startup parameter: replication (SQLSTATE 08P01))")
	require.NotContains(t, err.Error(), "127.0.0.1", "the address stays out")
	require.Contains(t, err.Error(), "the replication stream needs a server connection of its own")

	conn, err := outbox.ConnectReplication(ctx, direct+"&pool_max_conns=3&default_query_exec_mode=exec")
	require.NoError(t, err)
	conn.Close(ctx)
}

// The pool through PgBouncer and ReplicationURL direct: the relay
// streams, publishes every event once and in order per key, and its lease
// is held by a connection of its own on the server, not by one of the
// pool's.
func TestLogicalRelayWithAPooledPoolAndADirectReplicationURL(t *testing.T) {
	t.Parallel()
	b, direct := logicalPooledSetup(t)
	pub, _ := publisher(t, b.nats.URL)
	r, err := outbox.NewLogicalRelay(b.db.Pool, b.ob, pub, &outbox.LogicalRelayConfig{ReplicationURL: direct,
		Logger: testLogger(), StatusInterval: 200 * time.Millisecond,
		Table: outbox.RelayConfig{Lease: 2 * time.Second, PollInterval: 100 * time.Millisecond}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("logical relay did not stop")
		}
	})
	var want []broker.Message
	for i := range 60 {
		m := b.msg(string(rune('a'+i%4)), i)
		enqueue(t, b.db, b.ob, m)
		want = append(want, m)
	}
	waitCount(t, b.stream, uint64(len(want)), 30*time.Second)
	requireExactlyOnceInOrder(t, readStream(t, b.stream), want)
	var holder string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT a.application_name FROM pg_locks l
		JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.objid::bigint = hashtextextended($1, 0)::int8 & x'ffffffff'::bigint`,
		"oncekit.logical_relay.oncekit_"+b.db.Schema).Scan(&holder))
	require.Equal(t, "oncekit-logical-relay-lease", holder)
}

// A ReplicationURL that reaches another database than the pool's: Run
// returns a *DatabaseMismatchError at once, naming both databases, and
// publishes nothing from a stream of the other database.
func TestLogicalRelayRefusesAReplicationURLOfAnotherDatabase(t *testing.T) {
	t.Parallel()
	b := logicalSetup(t)
	pub, _ := publisher(t, b.nats.URL)
	other := logicalCluster.pg.URL("template1")
	r, err := outbox.NewLogicalRelay(b.db.Pool, b.ob, pub, &outbox.LogicalRelayConfig{ReplicationURL: other,
		Logger: testLogger(), MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = r.Run(ctx)
	require.NoError(t, ctx.Err(), "Run returned before its deadline")
	t.Logf("Run: %v", err)
	require.ErrorIs(t, err, outbox.ErrDatabaseMismatch)
	var me *outbox.DatabaseMismatchError
	require.True(t, errors.As(err, &me), "%T", err)
	require.Equal(t, "postgres", me.PoolDatabase)
	require.Equal(t, "template1", me.ReplicationDatabase)
	require.Equal(t, me.PoolSystemID, me.ReplicationSystemID, "one cluster")
	require.NotContains(t, err.Error(), "127.0.0.1", "the address stays out")

	_, err = outbox.NewLogicalRelay(b.db.Pool, b.ob, pub, &outbox.LogicalRelayConfig{ReplicationURL: "postgres://%zz"})
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	require.Contains(t, err.Error(), "ReplicationURL")
}
