package migrations_test

import (
	"context"
	"hash/fnv"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/migrations"
)

// Up runs through PgBouncer in transaction pooling mode, with pgx's exec
// and cache_describe modes: it is one transaction, and its lock
// (pg_advisory_xact_lock) ends with it, so no session state is left on
// the server connection the pooler hands on. Four deploys at once, each
// through a pool of its own, apply each migration once, and no lock is
// left behind.
func TestUpThroughPgBouncer(t *testing.T) {
	t.Parallel()
	for _, mode := range testenv.PooledModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			url := testenv.PooledURL(t, mode)
			require.True(t, testenv.Pooled(t, url))
			schema := testenv.Name(t)
			const deploys = 4
			pools := make([]*pgxpool.Pool, deploys)
			for i := range pools {
				p, err := pgxpool.New(ctx, url)
				require.NoError(t, err)
				t.Cleanup(p.Close)
				pools[i] = p
			}
			t.Cleanup(func() { _, _ = pools[0].Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`) })

			var wg sync.WaitGroup
			results := make([][]migrations.Migration, deploys)
			errs := make([]error, deploys)
			for i := range deploys {
				wg.Go(func() { results[i], errs[i] = migrations.Up(ctx, pools[i], migrations.WithSchema(schema)) })
			}
			wg.Wait()
			total := 0
			for i := range deploys {
				require.NoError(t, errs[i])
				total += len(results[i])
			}
			require.Equal(t, len(migrations.All()), total, "each migration applied by exactly one deploy")
			again, err := migrations.Up(ctx, pools[1], migrations.WithSchema(schema))
			require.NoError(t, err)
			require.Empty(t, again)
			st, err := migrations.Status(ctx, pools[2], migrations.WithSchema(schema))
			require.NoError(t, err)
			for _, s := range st {
				require.NotNil(t, s.AppliedAt, "%03d_%s", s.Version, s.Name)
			}
			// The migration lock's key (fnv-64a of "oncekit.migrate:" and
			// the schema) is held by no server connection.
			h := fnv.New64a()
			h.Write([]byte("oncekit.migrate:" + schema))
			key := h.Sum64()
			var held int
			require.NoError(t, pools[3].QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
				AND classid::bigint = $1 AND objid::bigint = $2`, int64(key>>32), int64(key&0xffffffff)).Scan(&held))
			require.Zero(t, held, "no migration lock outlives its transaction")
		})
	}
}
