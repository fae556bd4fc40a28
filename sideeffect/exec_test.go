package sideeffect_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/sideeffect"
)

// plainDB hides the pool's SendBatch: the dispatcher then runs each of its
// statements as a plain query.
type plainDB struct{ oncekit.DB }

// runOn runs a dispatcher on db until the returned stop is called.
func runOn(t *testing.T, db oncekit.DB, l *sideeffect.Ledger, providers map[string]sideeffect.Provider, cfg *sideeffect.DispatcherConfig) (stop func()) {
	t.Helper()
	d, err := sideeffect.NewDispatcher(db, l, providers, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); require.NoError(t, d.Run(ctx)) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

func TestDispatchOnADBWithoutBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t)
	keys := b.record(t, "order.paid", 30)
	runOn(t, plainDB{b.db.Pool}, b.ledger, map[string]sideeffect.Provider{"order.paid": hook(rc, nil)}, fastConfig(b))
	b.waitState(t, sideeffect.StateConfirmed, 30, 20*time.Second)
	rc.check(t, keys)
	for _, k := range keys {
		require.Equal(t, 1, rc.callsOf(k))
		require.Equal(t, 1, b.rowByKey(t, k).Attempts)
	}
}

// The dispatcher's statements run with generic plans, and the setting lasts
// for those statements only: the connection goes back to the pool with the
// default.
func TestDispatcherStatementsUseGenericPlans(t *testing.T) {
	t.Parallel()
	testenv.RequireDirect(t, "it counts the generic plans of prepared statements, which pgx does not prepare through a pooler")
	b := setup(t)
	rc := newReceiver(t)
	keys := b.record(t, "order.paid", 20)
	pool, err := pgxpool.New(context.Background(), b.db.URL+"&pool_max_conns=1")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	stop := runOn(t, pool, b.ledger, map[string]sideeffect.Provider{"order.paid": hook(rc, nil)}, fastConfig(b))
	b.waitState(t, sideeffect.StateConfirmed, 20, 20*time.Second)
	stop()
	rc.check(t, keys)
	var mode string
	require.NoError(t, pool.QueryRow(context.Background(), "SHOW plan_cache_mode").Scan(&mode))
	require.Equal(t, "auto", mode)
	// The one connection holds the dispatcher's prepared statements.
	var statements, custom int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*), coalesce(sum(custom_plans), 0)
		FROM pg_prepared_statements WHERE statement LIKE '%lease_owner%'`).Scan(&statements, &custom))
	require.Positive(t, statements)
	require.Zero(t, custom)
}
