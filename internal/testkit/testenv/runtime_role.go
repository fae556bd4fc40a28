package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	neturl "net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// RuntimeRole is a login role without superuser that may use d's schema
// and do anything to the tables and sequences in it at the time it was
// made: the role a service runs as, whose grants a test can take away
// (REVOKE) and give back while a daemon runs.
type RuntimeRole struct {
	Name string        // the role's name, quoted with pgx.Identifier where SQL names it
	URL  string        // d.URL logged in as the role, search_path its schema
	Pool *pgxpool.Pool // a pool on URL, closed at the test's end
}

// NewRuntimeRole makes a RuntimeRole for d's schema; it is dropped, with
// everything granted to it, at the test's end.
func NewRuntimeRole(t testing.TB, d *DB) *RuntimeRole {
	t.Helper()
	ctx := context.Background()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "rt_" + hex.EncodeToString(b[:])
	role, schema := pgx.Identifier{name}.Sanitize(), pgx.Identifier{d.Schema}.Sanitize()
	for _, sql := range []string{
		"CREATE ROLE " + role + " LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE",
		"ALTER ROLE " + role + " SET search_path = " + schema,
		"GRANT USAGE ON SCHEMA " + schema + " TO " + role,
		"GRANT ALL ON ALL TABLES IN SCHEMA " + schema + " TO " + role,
		"GRANT ALL ON ALL SEQUENCES IN SCHEMA " + schema + " TO " + role,
	} {
		_, err := d.Pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	u, err := neturl.Parse(d.URL)
	require.NoError(t, err, "the test database's URL must be a URL")
	u.User = neturl.User(name)
	r := &RuntimeRole{Name: name, URL: u.String()}
	cfg, err := pgxpool.ParseConfig(r.URL)
	require.NoError(t, err)
	r.Pool, err = pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		r.Pool.Close()
		c, err := pgx.Connect(ctx, DatabaseURL())
		if err != nil {
			return
		}
		defer func() { _ = c.Close(ctx) }()
		_, _ = c.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", name)
		_, _ = c.Exec(ctx, "DROP OWNED BY "+role+" CASCADE")
		_, _ = c.Exec(ctx, "DROP ROLE "+role)
	})
	return r
}

// Exec runs sql (a GRANT or REVOKE naming the role as %s) as the
// owner of d's schema.
func (r *RuntimeRole) Exec(t testing.TB, d *DB, sql string) {
	t.Helper()
	_, err := d.Pool.Exec(context.Background(), fmt.Sprintf(sql, pgx.Identifier{r.Name}.Sanitize()))
	require.NoError(t, err, sql)
}
