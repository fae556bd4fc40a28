package pgsql_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// Direct tells a connection with a backend of its own from one through
// PgBouncer in transaction mode, whose connection ID is its own.
func TestDirectTellsAPoolerFromTheServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct := func(url string) bool {
		conn, err := pgx.Connect(ctx, url)
		require.NoError(t, err)
		defer conn.Close(ctx) //nolint:errcheck
		d, err := pgsql.Direct(ctx, conn)
		require.NoError(t, err)
		return d
	}
	if !testenv.Pooled(t, testenv.DatabaseURL()) {
		require.True(t, direct(testenv.DatabaseURL()), "the server itself")
	}
	require.False(t, direct(testenv.PooledURL(t, "exec")), "PgBouncer")
}

// PgBouncer refuses every start-up parameter it does not track, and the
// refusal is told apart from others.
func TestRefusedStartupParameter(t *testing.T) {
	t.Parallel()
	cfg, err := pgx.ParseConfig(testenv.PooledURL(t, "exec"))
	require.NoError(t, err)
	cfg.RuntimeParams["jit"] = "off"
	_, err = pgx.ConnectConfig(context.Background(), cfg)
	require.Error(t, err)
	require.True(t, pgsql.RefusedStartupParameter(err), "%v", err)
	require.False(t, pgsql.RefusedStartupParameter(context.Canceled))
}
