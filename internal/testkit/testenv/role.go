package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// Role is a login role made for one test, for tests of least privilege:
// not a superuser, no CREATEDB, CREATEROLE or REPLICATION, and no
// privilege on anything of the test's schema until granted one. Roles are
// global to the cluster: each has a name of its own, and it is dropped when
// the test ends (with whatever it owns or was granted in the database).
type Role struct {
	Name string // the role's name
	URL  string // db's URL, logging in as the role
}

// NewRole creates a role on db's server.
func NewRole(t testing.TB, db *DB) *Role {
	t.Helper()
	ctx := context.Background()
	name := Name(t)
	var b [12]byte
	_, _ = rand.Read(b[:])
	password := hex.EncodeToString(b[:])
	u, err := url.Parse(db.URL)
	require.NoError(t, err, "testenv: NewRole needs DATABASE_URL as a URL")
	u.User = url.UserPassword(name, password)
	id := pgx.Identifier{name}.Sanitize()
	_, err = db.Pool.Exec(ctx, "CREATE ROLE "+id+" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION PASSWORD '"+password+"'")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, name)
		for _, stmt := range []string{"REASSIGN OWNED BY " + id + " TO CURRENT_USER", "DROP OWNED BY " + id, "DROP ROLE " + id} {
			if _, err := db.Pool.Exec(ctx, stmt); err != nil {
				t.Errorf("testenv: %s: %v", stmt, err)
			}
		}
	})
	return &Role{Name: name, URL: u.String()}
}
