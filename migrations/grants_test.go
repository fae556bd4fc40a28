package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/migrations"
)

// Role names are quoted, never spliced in: a name that tries to end the
// statement stays one identifier, and reserved or malformed names are
// refused before any SQL is made.
func TestGrantSQLQuotesAndRefusesRoleNames(t *testing.T) {
	t.Parallel()
	sql, err := migrations.GrantSQL(`app"; DROP TABLE x; --`, []migrations.Component{migrations.Dispatcher}, migrations.WithSchema("shop"))
	require.NoError(t, err)
	require.Equal(t, `-- oncekit: the privileges of "app""; DROP TABLE x; --" for dispatcher
GRANT USAGE ON SCHEMA "shop" TO "app""; DROP TABLE x; --";
GRANT SELECT, UPDATE, DELETE ON "shop".side_effects TO "app""; DROP TABLE x; --";
`, sql)
	for _, bad := range []string{"", "public", "PUBLIC", "pg_monitor", strings.Repeat("r", 64), "a\x00b", "a\nb", "a\xffb"} {
		_, err := migrations.GrantSQL(bad, []migrations.Component{migrations.Relay})
		require.ErrorIs(t, err, migrations.ErrInvalidRole, "%q", bad)
	}
	_, err = migrations.GrantSQL("app", nil)
	require.ErrorIs(t, err, migrations.ErrUnknownComponent)
	_, err = migrations.ParseComponents("relay,nope")
	require.ErrorIs(t, err, migrations.ErrUnknownComponent)
	_, err = migrations.GrantSQL("app", []migrations.Component{migrations.Relay}, migrations.WithSchema("bad-schema"))
	require.Error(t, err)
	sql, err = migrations.GrantSQL("app", []migrations.Component{migrations.LogicalRelay})
	require.NoError(t, err)
	require.Contains(t, sql, "REPLICATION attribute")
	require.NotContains(t, strings.ToUpper(strings.Join(grantLines(sql), "\n")), "REPLICATION")
}

// grantLines are sql's statements, comments left out.
func grantLines(sql string) []string {
	var out []string
	for _, l := range strings.Split(sql, "\n") {
		if l != "" && !strings.HasPrefix(l, "--") {
			out = append(out, l)
		}
	}
	return out
}

// Grant gives each component's role exactly its privileges: USAGE on the
// schema, the table privileges listed, nothing else (no CREATE, nothing on
// the bookkeeping table), and CheckGrants passes for it afterwards and not
// before.
func TestGrantGivesEachComponentItsPrivilegesOnly(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	for _, c := range migrations.Components() {
		role := testenv.NewRole(t, db)
		conn, err := pgx.Connect(ctx, role.URL)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })

		err = migrations.CheckGrants(ctx, conn, c, migrations.WithSchema(db.Schema))
		var missing *migrations.MissingGrantError
		require.ErrorAs(t, err, &missing, "%s before the grant", c)
		require.Equal(t, `USAGE on schema "`+db.Schema+`"`, missing.Missing[0])

		require.NoError(t, migrations.Grant(ctx, db.Pool, role.Name, []migrations.Component{c}, migrations.WithSchema(db.Schema)))
		require.NoError(t, migrations.CheckGrants(ctx, conn, c, migrations.WithSchema(db.Schema)), "%s", c)

		sql, err := migrations.GrantSQL(role.Name, []migrations.Component{c}, migrations.WithSchema(db.Schema))
		require.NoError(t, err)
		want := map[string]bool{}
		for _, l := range grantLines(sql)[1:] {
			privs, rest, _ := strings.Cut(strings.TrimPrefix(l, "GRANT "), " ON ")
			table, _, _ := strings.Cut(rest, " TO ")
			for _, p := range strings.Split(privs, ", ") {
				want[p+" "+table] = true
			}
		}
		var held []string
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT coalesce(array_agg(p.priv || ' "' || n.nspname || '".' || c.relname ORDER BY 1), '{}')
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			CROSS JOIN unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) AS p(priv)
			WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'S') AND has_table_privilege($2, c.oid, p.priv)`,
			db.Schema, role.Name).Scan(&held))
		for _, h := range held {
			require.True(t, want[h], "%s: %s holds %s, which was not granted", c, role.Name, h)
			delete(want, h)
		}
		require.Empty(t, want, "%s: granted but not held", c)
		var create bool
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT has_schema_privilege($1, $2, 'CREATE') OR has_database_privilege($1, current_database(), 'CREATE')`,
			role.Name, db.Schema).Scan(&create))
		require.False(t, create, "%s may create", c)
	}
}

// A role missing one grant is told which privilege on which table, and
// the command that grants it.
func TestCheckGrantsNamesTheMissingPrivilege(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	role := testenv.NewRole(t, db)
	require.NoError(t, migrations.Grant(ctx, db.Pool, role.Name, []migrations.Component{migrations.Relay}, migrations.WithSchema(db.Schema)))
	_, err := db.Pool.Exec(ctx, fmt.Sprintf(`REVOKE UPDATE ON %q.relay_partitions FROM %q`, db.Schema, role.Name))
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, role.URL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	err = migrations.CheckGrants(ctx, conn, migrations.Relay, migrations.WithSchema(db.Schema))
	var missing *migrations.MissingGrantError
	require.True(t, errors.As(err, &missing), "%v", err)
	require.Equal(t, []string{`UPDATE on "` + db.Schema + `".relay_partitions`}, missing.Missing)
	require.Equal(t, fmt.Sprintf(`role %q lacks UPDATE on "%s".relay_partitions, which the relay needs: as the schema's owner, run `+
		"`oncekit migrate grant --schema %s --role %s --for relay` (add --sql to print the statements instead)",
		role.Name, db.Schema, db.Schema, role.Name), err.Error())

	// The owner holds everything; a schema that does not exist is left to
	// the caller.
	require.NoError(t, migrations.CheckGrants(ctx, db.Pool, migrations.ConsoleWrite, migrations.WithSchema(db.Schema)))
	require.NoError(t, migrations.CheckGrants(ctx, conn, migrations.Relay, migrations.WithSchema("no_such_schema_oncekit")))
}
