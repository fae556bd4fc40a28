package migrations

import (
	"context"
	"fmt"
	"strings"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/pgsql"
)

// MissingGrantError is CheckGrants' answer when the connected role lacks
// privileges a component needs. Its message names each one and the command
// that grants them.
type MissingGrantError struct {
	Role      string    // the connected role (current_user)
	Schema    string    // the schema of oncekit's tables
	Component Component // the component that needs them
	// Missing are the privileges lacking, as "UPDATE on "oncekit".outbox" or
	// "USAGE on schema "oncekit"".
	Missing []string
}

func (e *MissingGrantError) Error() string {
	list := strings.Join(e.Missing, ", ")
	if n := len(e.Missing); n > 1 {
		list = strings.Join(e.Missing[:n-1], ", ") + " and " + e.Missing[n-1]
	}
	return fmt.Sprintf("role %q lacks %s, which %s needs: as the schema's owner, run "+
		"`oncekit migrate grant --schema %s --role %s --for %s` (add --sql to print the statements instead)",
		e.Role, list, describe(e.Component), e.Schema, e.Role, e.Component)
}

// describe names a component in a sentence.
func describe(c Component) string {
	switch c {
	case Producer:
		return "a producer (Enqueue, Record)"
	case Relay:
		return "the relay"
	case LogicalRelay:
		return "the logical relay"
	case Consumer:
		return "the inbox consumer"
	case Dispatcher:
		return "the dispatcher"
	case Edge:
		return "the idempotency edge"
	case Console:
		return "the console"
	case ConsoleWrite:
		return "the console with writes"
	case Drift:
		return "drift"
	}
	return string(c)
}

// checkSQL lists, for the tables of the schema $1 that exist, the
// privileges $2/$3 (table, privilege, in order) the connected role lacks,
// and whether it lacks USAGE on the schema. It reads the catalogs, which
// need no privilege, so it answers even without USAGE on the schema.
const checkSQL = `SELECT current_user::text, n.oid IS NOT NULL, coalesce(has_schema_privilege(n.oid, 'USAGE'), true),
	coalesce(ARRAY(
		SELECT t.priv || ' on "' || n.nspname || '".' || t.tbl
		FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS t(tbl, priv, ord)
		JOIN pg_class c ON c.relname = t.tbl AND c.relnamespace = n.oid
		WHERE NOT has_table_privilege(c.oid, t.priv)
		ORDER BY t.ord), '{}')
	FROM (SELECT 1) AS one LEFT JOIN pg_namespace n ON n.nspname = $1`

// CheckGrants tells whether the connected role holds every privilege
// component needs in the schema (WithSchema), and otherwise returns a
// *MissingGrantError naming the ones it lacks. Call it at start, so that a
// role missing a grant stops the component with that message instead of
// failing statement after statement. A superuser holds everything; a
// schema or table that does not exist is left to the caller (the
// migrations were not run).
func CheckGrants(ctx context.Context, db oncekit.Querier, component Component, opts ...Option) error {
	schema, err := resolve(opts)
	if err != nil {
		return err
	}
	tgs, ok := needs[component]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownComponent, component)
	}
	var tables, privs []string
	for _, tg := range tgs {
		for _, p := range tg.privs {
			tables, privs = append(tables, tg.table), append(privs, p)
		}
	}
	var (
		role          string
		exists, usage bool
		missing       []string
	)
	if err := db.QueryRow(ctx, checkSQL, schema, tables, privs).Scan(&role, &exists, &usage, &missing); err != nil {
		return fmt.Errorf("migrations: check the grants of %s: %w", describe(component), err)
	}
	if !exists {
		return nil
	}
	if !usage {
		missing = append([]string{"USAGE on schema " + pgsql.Render("{schema}", schema)}, missing...)
	}
	if len(missing) == 0 {
		return nil
	}
	return &MissingGrantError{Role: role, Schema: schema, Component: component, Missing: missing}
}
