package outbox_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// A relay whose pool leads to a read-only server (a standby, or an old
// primary that came back as one after a failover) cannot write its
// heartbeat or its leases: it must say so clearly and keep trying at a
// bounded pace, not spin, so that it resumes once its address leads to a
// primary again.
func TestRelayOnAReadOnlyServer(t *testing.T) {
	testenv.RequireDirect(t, "runs on a primary and a standby of its own, which the pooled leg does not put behind its pooler")
	ctx := context.Background()
	pg := pgcluster.StartForTest(ctx, t, pgcluster.Options{Settings: "fsync = off\nmax_connections = 100\n"})
	standby, err := pg.Standby(ctx)
	require.NoError(t, err)
	t.Cleanup(standby.Close)
	b := setupDB(t, testenv.NewDBOn(t, pg.URL("postgres")))
	pool, err := pgxpool.New(ctx, standby.URL("postgres")+"&search_path="+b.db.Schema)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.Eventually(t, func() bool { // the schema has reached the standby
		var n int
		return pool.QueryRow(ctx, `SELECT count(*) FROM relay_partitions`).Scan(&n) == nil && n > 0
	}, 30*time.Second, 20*time.Millisecond)
	pub, _ := publisher(t, b.nats.URL)
	r, err := outbox.NewRelay(pool, b.ob, pub, &outbox.RelayConfig{Lease: 2 * time.Second, PollInterval: 50 * time.Millisecond, Logger: testLogger()})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()

	// Refused, said clearly, at the heartbeat's pace.
	var unhealthy error
	require.Eventually(t, func() bool { unhealthy = r.Healthy(ctx); return unhealthy != nil }, 30*time.Second, 20*time.Millisecond)
	start := time.Now()
	require.ErrorContains(t, unhealthy, "read-only")
	require.ErrorContains(t, unhealthy, "25006")
	failures := func() int {
		m := regexp.MustCompile(`\((\d+) failures\)`).FindStringSubmatch(fmt.Sprint(r.Healthy(ctx)))
		if m == nil {
			return 0
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	before := failures()
	time.Sleep(3 * time.Second) // a pace is measured over time
	n := failures() - before
	t.Logf("on a read-only server: %v; %d more failures in %s", unhealthy, n, time.Since(start).Round(time.Millisecond))
	require.Less(t, n, 30, "the relay spins on a read-only server")

	// The address leads to a primary again: the relay publishes.
	require.NoError(t, standby.Promote(ctx))
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = b.ob.Enqueue(ctx, tx, broker.Message{ID: uuid.New(), Subject: b.subject + ".a", Key: "k", Payload: []byte("x")})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	waitCount(t, b.stream, 1, 30*time.Second)
	require.Eventually(t, func() bool { return r.Healthy(ctx) == nil }, 30*time.Second, 20*time.Millisecond)
}
