package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
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
	pair := testenv.NewSyncPair(t)
	b := setupDB(t, pair.DB)
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
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = b.ob.Enqueue(ctx, tx, broker.Message{ID: uuid.New(), Subject: b.subject + ".a", Key: "k", Payload: []byte("x")})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	waitCount(t, b.stream, 1, 30*time.Second) // the relay holds its partitions

	pair.StopStandby(t)
	tx, err = b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = b.ob.Enqueue(ctx, tx, broker.Message{ID: uuid.New(), Subject: b.subject + ".a", Key: "k", Payload: []byte("x")})
	require.NoError(t, err)
	var pid int
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	testenv.CommitLocally(t, b.db.Pool, tx, pid)
	var visible int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&visible))
	require.Equal(t, 2, visible, "the row is visible on the primary")

	// The relay has read the row and waits, in its barrier's commit, for
	// the standby.
	testenv.WaitSyncRep(t, b.db.Pool, func(_ int, query string) bool { return strings.EqualFold(query, "commit") }) // any connection: the pool hands the committing one out again
	require.Equal(t, uint64(1), streamCount(t, b.stream), "published a row its synchronous standby does not have")

	pair.StartStandby(t)
	waitCount(t, b.stream, 2, 30*time.Second)
}
