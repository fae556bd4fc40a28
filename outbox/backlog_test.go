package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// Backlog runs without JIT compilation even on a connection that would
// compile every query over a table (as a large outbox's estimates would
// make it): compiling costs hundreds of milliseconds of CPU for a
// query that runs in one.
func TestBacklogIsNotJITCompiled(t *testing.T) {
	t.Parallel()
	testenv.RequireDirect(t, "it sets JIT start-up parameters, which a pooler refuses")
	ctx := context.Background()
	db := testenv.NewDB(t)
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	// Cost 1: every query over a table compiles, a bare SELECT (cost 0.01)
	// does not.
	for _, p := range []string{"jit_above_cost", "jit_optimize_above_cost", "jit_inline_above_cost"} {
		cfg.ConnConfig.RuntimeParams[p] = "1"
	}
	cfg.ConnConfig.RuntimeParams["jit"] = "on"
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var available bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_jit_available()`).Scan(&available))
	if !available {
		t.Skip("this PostgreSQL has no JIT provider")
	}
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := ob.Enqueue(ctx, tx,
			broker.Message{ID: uuid.New(), Subject: "a.b", Key: "k1"},
			broker.Message{ID: uuid.New(), Subject: "a.b", Key: "k2"},
			broker.Message{ID: uuid.New(), Subject: "a.b"})
		return err
	}))
	// The connection compiles: a small aggregate over the outbox takes the
	// compiler's time.
	start := time.Now()
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), min(created_at) FROM outbox WHERE parked_at IS NULL`).Scan(new(int64), new(*time.Time)))
	compiled := time.Since(start)

	start = time.Now()
	for range 3 {
		b, err := ob.Backlog(ctx, pool)
		require.NoError(t, err)
		require.EqualValues(t, 3, b.Pending)
	}
	require.Less(t, time.Since(start), compiled, "three Backlog calls took longer than one compiled query")
	// The setting was the statement's own: the connection compiles again.
	var jit string
	require.NoError(t, pool.QueryRow(ctx, `SELECT current_setting('jit')`).Scan(&jit))
	require.Equal(t, "on", jit)
}

func TestBacklogByPartition(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ob := newOutbox(t, db, outbox.Config{})
	ctx := context.Background()
	for _, p := range []int{0, 0, 3} {
		_, err := db.Pool.Exec(ctx, `INSERT INTO outbox (id, partition, subject, payload, created_at)
			VALUES (gen_random_uuid(), $1, 'a.b', '', now() - make_interval(mins => $1 + 1))`, p)
		require.NoError(t, err)
	}
	_, err := db.Pool.Exec(ctx, `INSERT INTO outbox (id, partition, subject, payload, parked_at) VALUES (gen_random_uuid(), 2, 'a.b', '', now())`)
	require.NoError(t, err)
	parts, err := ob.BacklogByPartition(ctx, db.Pool)
	require.NoError(t, err)
	require.Len(t, parts, 2, "the parked row of partition 2 is not backlog")
	require.Equal(t, 0, parts[0].Partition)
	require.Equal(t, int64(2), parts[0].Pending)
	require.InDelta(t, 60, parts[0].OldestAge.Seconds(), 5)
	require.Equal(t, 3, parts[1].Partition)
	require.InDelta(t, 240, parts[1].OldestAge.Seconds(), 5)
	total, err := ob.Backlog(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, int64(3), total.Pending)
}
