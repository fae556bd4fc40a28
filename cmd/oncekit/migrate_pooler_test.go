package main

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/migrations"
)

// `oncekit migrate up` and `status` through PgBouncer in transaction
// pooling mode: the migrations apply (one transaction, a lock that ends
// with it), and status sees every one applied.
func TestMigrateThroughPgBouncer(t *testing.T) {
	t.Parallel()
	url := testenv.PooledURL(t, "exec")
	require.True(t, testenv.Pooled(t, url))
	schema := testenv.Name(t)
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), testenv.DatabaseURL())
		if err == nil {
			_, _ = c.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
			_ = c.Close(context.Background())
		}
	})
	vars := map[string]string{"DATABASE_URL": url, "ONCEKIT_SCHEMA": schema}
	code, stdout, stderr := cli(t, vars, "migrate", "up")
	require.Equal(t, 0, code, stderr)
	t.Logf("migrate up:\n%s", stdout)
	code, stdout, stderr = cli(t, vars, "migrate", "status")
	require.Equal(t, 0, code, stderr)
	require.NotContains(t, strings.ToLower(stdout), "pending", stdout)
	require.Equal(t, len(migrations.All()), strings.Count(stdout, "applied"), stdout)
}
