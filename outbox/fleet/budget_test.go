package fleet_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox/fleet"
)

// Two members serve one database of 16 partitions under load, each within
// its budget (MaxConnsPerDatabase 3, below the 16 partitions it could
// hold), counted in pg_stat_activity by their application_name.
func TestConnectionsStayWithinTheBudget(t *testing.T) {
	testenv.RequireDirect(t, "counts server connections by application_name, which a pooler's server connections keep from their last client")
	t.Parallel()
	w := newWorld(t)
	d := newOutboxDB(t, "db")
	apps := []string{w.name + "_m1", w.name + "_m2"}
	var ms []*member
	for i, app := range apps {
		cfg := w.config(fmt.Sprintf("m%d", i+1))
		cfg.ApplicationName = app
		cfg.MaxConnsPerDatabase = 3
		ms = append(ms, w.start(t, cfg, d.def))
	}
	require.Eventually(t, func() bool {
		return len(ms[0].f.Members()) == 2 && len(ms[1].f.Members()) == 2 &&
			len(ms[0].f.Databases()) == 1 && len(ms[1].f.Databases()) == 1
	}, 60*time.Second, 20*time.Millisecond)

	var peak [2]atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		for ctx.Err() == nil {
			for i, app := range apps {
				var n int64
				if err := d.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
					continue
				}
				if n > peak[i].Load() {
					peak[i].Store(n)
				}
			}
		}
	}()
	var msgs []broker.Message
	for i := range 40 {
		msgs = append(msgs, w.enqueue(t, d, fmt.Sprintf("k%d", i), 100)...)
	}
	w.pub.waitPublished(t, msgs, 60*time.Second)
	cancel()
	sampler.Wait()
	for i, m := range ms {
		require.Equal(t, 3.0, testenv.Metric(t, m.reg, "oncekit_fleet_database_connections_budget", "database", "db"))
		t.Logf("member %d: at most %d connections (budget 3)", i+1, peak[i].Load())
		require.LessOrEqual(t, peak[i].Load(), int64(3), "member %d over its budget", i+1)
		require.Positive(t, peak[i].Load(), "member %d connected", i+1)
	}
	w.pub.requireOnce(t, msgs)
}

// A repartition changes the budget: the member's relay of the database is
// started again with a pool of the new size (16 partitions on one member:
// 17 connections; 4: 5; 8: 9), and what was written across the changes is
// published once.
func TestBudgetFollowsARepartition(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	d := newOutboxDB(t, "db")
	cfg := w.config("m1")
	cfg.MaxConnsPerDatabase = 20
	m := w.start(t, cfg, d.def)
	budget := func() float64 {
		return testenv.Metric(t, m.reg, "oncekit_fleet_database_connections_budget", "database", "db")
	}
	require.Eventually(t, func() bool { return budget() == 17 }, 60*time.Second, 20*time.Millisecond)
	var msgs []broker.Message
	for _, n := range []int{4, 8} {
		msgs = append(msgs, w.enqueue(t, d, fmt.Sprintf("before-%d", n), 20)...)
		require.NoError(t, d.ob.Repartition(context.Background(), d.db.Pool, n))
		msgs = append(msgs, w.enqueue(t, d, fmt.Sprintf("after-%d", n), 20)...)
		want := float64(fleet.Budget(n, 1, cfg.MaxConnsPerDatabase))
		require.Eventually(t, func() bool { return budget() == want }, 60*time.Second, 20*time.Millisecond,
			"budget %v, want %v after repartitioning to %d", budget(), want, n)
	}
	w.pub.waitPublished(t, msgs, 60*time.Second)
	w.pub.requireOnce(t, msgs)
}
