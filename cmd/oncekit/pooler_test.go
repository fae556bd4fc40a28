package main

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// Every command connects through PgBouncer in transaction mode with its
// pooling settings at their defaults: no start-up parameter it refuses
// (jit, which a direct connection still turns off for its session).
func TestCommandsConnectThroughPgBouncer(t *testing.T) {
	t.Parallel()
	db := testenv.NewDBOn(t, testenv.PooledURL(t, "exec"))
	code, out, stderr := cli(t, dbVars(db), "status")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "relays: none")
	code, _, stderr = cli(t, dbVars(db), "migrate", "status")
	require.Equal(t, 0, code, stderr)
	require.NotContains(t, stderr, "startup parameter")

	// A parameter of the URL's own that the pooler refuses is named, with
	// what to do instead.
	vars := dbVars(db)
	vars["DATABASE_URL"] += "&search_path=" + db.Schema
	code, _, stderr = cli(t, vars, "status")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "(a connection pooler) refused a start-up parameter of the URL: unsupported startup parameter: search_path: remove it from the URL and set it for the role instead")
}

// A direct connection runs with JIT off, a setting of its session.
func TestDirectConnectionsRunWithoutJIT(t *testing.T) {
	t.Parallel()
	testenv.RequireDirect(t, "the session setting is made on a direct connection only")
	ctx := context.Background()
	d := &dbFlags{e: &env{getenv: func(k string) string {
		return map[string]string{"DATABASE_URL": testenv.DatabaseURL()}[k]
	}}}
	pool, err := d.openWith(ctx, false)
	require.NoError(t, err)
	defer pool.Close()
	var jit string
	require.NoError(t, pool.QueryRow(ctx, "SHOW jit").Scan(&jit))
	require.Equal(t, "off", jit)
}

// A password holding an unencoded '@' or '/' is refused before anything
// connects, and no part of it is printed; one holding ':' is read as pgx
// reads it, and is not printed either.
func TestURLWithUnencodedPasswordCharacters(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ url, want string }{
		{"postgres://app:p@S3cret@127.0.0.1:1/app", "unencoded '@'"},
		{"postgresql://app:p/S3cret@127.0.0.1:1/app", "unencoded '/'"},
		{"postgres://app:p:S3cret@127.0.0.1:1/app", "127.0.0.1:1 is unreachable"},
	} {
		for _, name := range []string{"status", "migrate up", "relay", "dispatch --unsigned --endpoint k=http://127.0.0.1:1", "drift"} {
			args := append(strings.Fields(name), "--database-url", tc.url)
			code, out, stderr := cli(t, nil, args...)
			require.NotEqual(t, 0, code, "%s %s", name, tc.url)
			require.Contains(t, stderr, tc.want, name)
			require.NotContains(t, out+stderr, "S3cret", name)
		}
	}
}

// A read-only standby's URL given as the primary's: every command that
// writes refuses it at start, naming the cause; status and drift read it.
func TestStandbyIsRefusedWhereWritesAreNeeded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary := pgcluster.StartForTest(ctx, t, pgcluster.Options{})
	standby, err := primary.Standby(ctx)
	require.NoError(t, err)
	t.Cleanup(standby.Close)
	db := testenv.NewDBOn(t, primary.URL("postgres"))
	// The schema reaches the standby.
	require.Eventually(t, func() bool {
		conn, err := pgx.Connect(ctx, standby.URL("postgres"))
		if err != nil {
			return false
		}
		defer conn.Close(ctx) //nolint:errcheck
		var ok bool
		return conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", db.Schema+".outbox").Scan(&ok) == nil && ok
	}, 30e9, 50e6)
	vars := map[string]string{"DATABASE_URL": standby.URL("postgres"), "ONCEKIT_SCHEMA": db.Schema, "NATS_URL": "nats://127.0.0.1:1"}
	for _, name := range []string{"migrate up", "relay", "dispatch --unsigned --endpoint k=http://127.0.0.1:1", "outbox unpark --all", "effects retry 1"} {
		code, _, stderr := cli(t, vars, strings.Fields(name)...)
		require.Equal(t, 1, code, "%s: %s", name, stderr)
		require.Contains(t, stderr, "is a read-only standby (in recovery): give the primary's URL", name)
	}
	code, out, stderr := cli(t, vars, "status")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "relays: none")
}

// A URL carrying hostile bytes (NUL, control characters, invalid UTF-8, a
// megabyte of it) as --database-url, --replication-url or --standby-url ends in a clear
// error and an exit, and no part of the password is printed.
func TestHostileDatabaseURLs(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"postgres://app:S3cret@127.0.0.1:1/app\x00",
		"postgres://app:S3cret\x00@127.0.0.1:1/app",
		"postgres://app:S3cret@127.0.0.1:1/a\x1b[2Jpp",
		"postgres://app:S3cret@127.0.0.1:1/\xff\xfe",
		"postgres://app:S3cret@127.0.0.1:1/app?sslmode=\n",
		"postgres://app:S3cret@127.0.0.1:1/" + strings.Repeat("x", 1<<20),
	} {
		for _, args := range [][]string{
			{"status", "--database-url", u},
			{"relay", "--logical", "--database-url", "postgres://app@127.0.0.1:1/app", "--replication-url", u},
			{"relay", "--logical", "--database-url", "postgres://app@127.0.0.1:1/app", "--standby-url", u},
			{"status", "--database-url", "postgres://app@127.0.0.1:1/app", "--standby-url", u},
		} {
			code, out, stderr := cli(t, nil, args...)
			require.NotEqual(t, 0, code, "%q", args[0])
			require.NotEmpty(t, stderr)
			require.NotContains(t, out+stderr, "S3cret")
			require.Less(t, len(stderr), 4096, "the error does not echo the input back whole")
			if args[len(args)-2] == "--standby-url" {
				require.Contains(t, stderr, "--standby-url", "refused for the flag that carries it, before any connection")
			}
		}
	}
}
