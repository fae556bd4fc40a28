package migrations_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/migrations"
)

func TestUpIsIdempotentAndRecorded(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t) // applies everything once
	ctx := context.Background()

	again, err := migrations.Up(ctx, db.Pool, migrations.WithSchema(db.Schema))
	require.NoError(t, err)
	require.Empty(t, again, "second run must be a no-op")

	st, err := migrations.Status(ctx, db.Pool, migrations.WithSchema(db.Schema))
	require.NoError(t, err)
	require.Len(t, st, len(migrations.All()))
	for _, s := range st {
		require.NotNil(t, s.AppliedAt, "%03d_%s", s.Version, s.Name)
	}
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM "`+db.Schema+`".outbox`).Scan(&n))
}

func TestConcurrentUpAppliesOnce(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	schema := db.Schema + "_x"
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`) })

	const deploys = 4
	var wg sync.WaitGroup
	results := make([][]migrations.Migration, deploys)
	errs := make([]error, deploys)
	for i := range deploys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = migrations.Up(ctx, db.Pool, migrations.WithSchema(schema))
		}()
	}
	wg.Wait()
	total := 0
	for i := range deploys {
		require.NoError(t, errs[i])
		total += len(results[i])
	}
	require.Equal(t, len(migrations.All()), total, "each migration applied by exactly one deploy")
	var rows int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".schema_migrations`).Scan(&rows))
	require.Equal(t, len(migrations.All()), rows)
}

func TestStatusBeforeUp(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	st, err := migrations.Status(context.Background(), db.Pool, migrations.WithSchema(db.Schema+"_none"))
	require.NoError(t, err)
	for _, s := range st {
		require.Nil(t, s.AppliedAt)
	}
}

func TestSchemaNameIsValidated(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	_, err := migrations.Up(context.Background(), db.Pool, migrations.WithSchema(`x"; DROP TABLE y; --`))
	require.True(t, errors.Is(err, pgsql.ErrInvalidSchema))
	_, err = migrations.SQL(migrations.WithSchema("Bad-Name"))
	require.True(t, errors.Is(err, pgsql.ErrInvalidSchema))
}

func TestSQLRendersSchema(t *testing.T) {
	t.Parallel()
	sql, err := migrations.SQL(migrations.WithSchema("billing_events"))
	require.NoError(t, err)
	require.Contains(t, sql, `CREATE TABLE "billing_events".outbox`)
	require.NotContains(t, sql, "{schema}")
	require.Equal(t, len(migrations.All()), strings.Count(sql, "INSERT INTO \"billing_events\".schema_migrations"))
}

func TestUpStopsAtTarget(t *testing.T) {
	t.Parallel()
	db := testenv.NewDBAt(t, 4)
	ctx := context.Background()
	st, err := migrations.Status(ctx, db.Pool, migrations.WithSchema(db.Schema))
	require.NoError(t, err)
	for _, s := range st {
		require.Equal(t, s.Version <= 4, s.AppliedAt != nil, "%03d_%s", s.Version, s.Name)
	}
	rest, err := migrations.Up(ctx, db.Pool, migrations.WithSchema(db.Schema))
	require.NoError(t, err)
	require.Len(t, rest, len(migrations.All())-4)
	require.Equal(t, 5, rest[0].Version)
}
