package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// pooledLogical is a logical cluster with a PgBouncer (transaction
// pooling) in front of it, a schema migrated through the pooler, and the
// cluster's direct URL.
func pooledLogical(t *testing.T) (db *testenv.DB, direct string) {
	t.Helper()
	pg := pgcluster.StartForTest(context.Background(), t, pgcluster.Options{Settings: "wal_level = logical\nfsync = off\n"})
	direct = pg.URL("postgres")
	db = testenv.NewDBOn(t, testenv.StartPgBouncer(t, direct).URL)
	require.True(t, testenv.Pooled(t, db.URL))
	return db, direct
}

// `relay --logical` with DATABASE_URL through PgBouncer and nothing else
// exits 1 at once with the error that names the pooler and the flag to
// give, and prints no part of the URL's credentials.
func TestRelayLogicalRefusesAPooledURL(t *testing.T) {
	t.Parallel()
	db, _ := pooledLogical(t)
	nats := testenv.NewNATS(t)
	vars := dbVars(db)
	vars["NATS_URL"] = nats.URL
	name := testenv.Name(t)
	start := time.Now()
	code, _, stderr := cli(t, vars, "relay", "--logical", "--listen", "", "--stream", name, "--subjects", name+".>")
	t.Logf("exit %d after %v, stderr:\n%s", code, time.Since(start), stderr)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "oncekit relay: oncekit: the connection goes through a connection pooler: the logical relay's lease connection found one")
	require.Contains(t, stderr, "(LogicalRelayConfig.ReplicationURL; oncekit relay --replication-url or ONCEKIT_REPLICATION_URL); its pool (oncekit: --database-url) may stay on the pooler")

	// The same through ONCEKIT_REPLICATION_URL, set to the pooler's URL.
	vars["ONCEKIT_REPLICATION_URL"] = db.URL
	code, _, stderr = cli(t, vars, "relay", "--logical", "--listen", "", "--stream", name, "--subjects", name+".>")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "the logical relay's lease connection found one")

	code, _, stderr = cli(t, vars, "relay", "--replication-url", db.URL, "--listen", "")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, "--replication-url needs --logical")

	code, _, stderr = cli(t, vars, "relay", "--logical", "--replication-url", "postgres://app:p@S3cret@127.0.0.1:1/app", "--listen", "")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, "--replication-url: the user information holds an unencoded '@'")
	require.NotContains(t, stderr, "S3cret")
}

// `relay --logical` with DATABASE_URL through PgBouncer and
// --replication-url direct: the polling pool goes through the pooler, the
// stream and the lease go direct, and every event enqueued into the WAL
// (through the pooler) reaches the stream once.
func TestRelayLogicalWithAPooledURLAndADirectReplicationURL(t *testing.T) {
	t.Parallel()
	db, direct := pooledLogical(t)
	nats := testenv.NewNATS(t)
	name := testenv.Name(t)
	vars := dbVars(db)
	vars["NATS_URL"] = nats.URL
	ctx, cancel := context.WithCancel(context.Background())
	var out lockedBuffer
	e := &env{stdout: &out, stderr: &out, getenv: func(k string) string { return vars[k] }}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, e, []string{"relay", "--logical", "--listen", "", "--replication-url", direct,
			"--stream", name, "--subjects", name + ".>"})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			require.Equal(t, 0, code, out.String())
		case <-time.After(30 * time.Second):
			t.Error("the relay did not stop")
		}
	})
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema, Logical: true})
	require.NoError(t, err)
	// The relay sets the slot up once it holds the lease.
	require.Eventually(t, func() bool {
		s, err := ob.SlotStatus(ctx, db.Pool)
		return err == nil && s.Exists
	}, 20*time.Second, 20*time.Millisecond, "the slot is set up: %s", out.String())
	const n = 50
	for i := range n {
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := ob.Enqueue(ctx, tx, broker.Message{ID: uuid.New(), Subject: fmt.Sprintf("%s.k%d", name, i%3), Payload: []byte("p")})
			return err
		}))
	}
	js := nats.JS
	var stream jetstream.Stream
	require.Eventually(t, func() bool {
		stream, err = js.Stream(ctx, name)
		if err != nil {
			return false
		}
		info, err := stream.Info(ctx)
		return err == nil && info.State.Msgs == n
	}, 30*time.Second, 20*time.Millisecond, "every event reaches the stream: %s", out.String())
	require.Contains(t, out.String(), "lease taken; streaming")
	require.NotContains(t, out.String(), "logical relay stopped")
}
