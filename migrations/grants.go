package migrations

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/pgsql"
)

// Component is a part of oncekit that runs under a database role of its
// own: a daemon (the relay, the dispatcher, the console, drift), or the
// library inside a service (the producer that enqueues, the consumer, the
// edge). Grant gives a role exactly the table privileges a component's
// statements use, and CheckGrants tells a component at start which of them
// its role lacks.
type Component string

// The components, as `oncekit migrate grant --for` names them.
const (
	// Producer enqueues events (outbox.Enqueue) and records side effects
	// (sideeffect.Ledger.Record) in the service's own transactions.
	Producer Component = "producer"
	// Relay is the polling relay (outbox.Relay, `oncekit relay`).
	Relay Component = "relay"
	// LogicalRelay is the logical-decoding relay (`oncekit relay
	// --logical`): the relay's privileges, INSERT on the outbox, where it
	// writes what it could not publish, and INSERT, UPDATE on
	// logical_slots, where it records the slot it creates and where the slot
	// stands (read after a failover). Its role also needs the REPLICATION
	// attribute, which Grant never gives (see docs/operations.md).
	LogicalRelay Component = "logical-relay"
	// Consumer is the inbox (inbox.Consumer): claims and dead letters.
	Consumer Component = "consumer"
	// Dispatcher is the side-effect dispatcher (`oncekit dispatch`).
	Dispatcher Component = "dispatcher"
	// Edge is the HTTP idempotency edge (idempotency.Edge).
	Edge Component = "edge"
	// Console is the read-only operator console (`oncekit console`).
	Console Component = "console"
	// ConsoleWrite is the console with its actions (`oncekit console
	// --writes`): unpark, replay, resolve, retry, and the audit.
	ConsoleWrite Component = "console-write"
	// Drift is the drift checker (`oncekit drift`) and `oncekit status`.
	Drift Component = "drift"
)

// tableGrant is the privileges one component needs on one table.
type tableGrant struct {
	table string
	privs []string
}

var (
	sel = []string{"SELECT"}
	// readAll is what drift and oncekit status read.
	readAll = []tableGrant{
		{"outbox", sel}, {"relay_partitions", sel}, {"relay_nodes", sel}, {"processed_messages", sel},
		{"dead_letters", sel}, {"side_effects", sel}, {"idempotency_keys", sel},
		{"logical_slots", sel}, // outbox.SlotStatus
		{"outbox_epoch", sel},  // the partition count and a repartition's phase
	}
)

// needs is each component's table privileges, read from its package's
// statements. Identity columns need no privilege on their sequence;
// pg_notify, LISTEN, advisory locks and pg_logical_emit_message need none.
var needs = map[Component][]tableGrant{
	Producer: {
		{"outbox", []string{"SELECT", "INSERT"}}, // INSERT ... RETURNING id
		{"outbox_epoch", sel},                    // the partition count, read by the INSERT
		{"side_effects", []string{"SELECT", "INSERT"}},
	},
	Relay: {
		{"outbox", []string{"SELECT", "UPDATE", "DELETE"}},           // read, settle, retention
		{"relay_partitions", []string{"SELECT", "UPDATE", "DELETE"}}, // leases, cursors, partitions retired
		{"relay_nodes", []string{"SELECT", "INSERT", "UPDATE", "DELETE"}},
		{"outbox_epoch", []string{"SELECT", "UPDATE"}}, // a repartition's barrier lifted
	},
	LogicalRelay: {
		{"outbox", []string{"SELECT", "INSERT", "UPDATE", "DELETE"}},
		{"relay_partitions", []string{"SELECT", "UPDATE", "DELETE"}},
		{"relay_nodes", []string{"SELECT", "INSERT", "UPDATE", "DELETE"}},
		{"outbox_epoch", []string{"SELECT", "UPDATE"}},
		{"logical_slots", []string{"SELECT", "INSERT", "UPDATE"}}, // SetUpLogical records the slot it creates, the relay where it stands
	},
	Consumer: {
		{"processed_messages", []string{"SELECT", "INSERT", "DELETE"}}, // claims, retention
		{"dead_letters", []string{"SELECT", "INSERT", "DELETE"}},
	},
	Dispatcher: {
		{"side_effects", []string{"SELECT", "UPDATE", "DELETE"}},
	},
	Edge: {
		{"idempotency_keys", []string{"SELECT", "INSERT", "UPDATE", "DELETE"}},
		{"idempotency_business_keys", []string{"SELECT", "INSERT", "UPDATE", "DELETE"}},
		{"idempotency_items", []string{"SELECT", "INSERT", "UPDATE", "DELETE"}}, // batch items (idempotency.Item)
	},
	Console: append(slices.Clip(readAll), tableGrant{"console_audit", sel}),
	ConsoleWrite: {
		{"outbox", []string{"SELECT", "UPDATE"}},       // unpark
		{"relay_partitions", sel},                      //
		{"relay_nodes", sel},                           //
		{"processed_messages", sel},                    //
		{"dead_letters", []string{"SELECT", "UPDATE"}}, // replay
		{"side_effects", []string{"SELECT", "UPDATE"}}, // resolve, retry
		{"idempotency_keys", []string{"SELECT", "UPDATE"}},
		{"idempotency_business_keys", []string{"SELECT", "DELETE"}}, // an edge record released (DELETE ... WHERE reads)
		{"console_audit", []string{"SELECT", "INSERT"}},
		{"logical_slots", sel}, // outbox.SlotStatus
		{"outbox_epoch", sel},  //
	},
	Drift: readAll,
}

// Components lists every component in the order `oncekit migrate grant`
// names them.
func Components() []Component {
	return []Component{Producer, Relay, LogicalRelay, Consumer, Dispatcher, Edge, Console, ConsoleWrite, Drift}
}

// ErrUnknownComponent is returned for a component that is not one of
// Components.
var ErrUnknownComponent = errors.New("migrations: unknown component")

// ErrInvalidRole is returned for a role name Grant will not use.
var ErrInvalidRole = errors.New("migrations: invalid role name")

// ParseComponents reads a comma-separated list of components
// ("relay,consumer").
func ParseComponents(list string) ([]Component, error) {
	var out []Component
	for _, s := range strings.Split(list, ",") {
		c := Component(strings.TrimSpace(s))
		if _, ok := needs[c]; !ok {
			names := make([]string, 0, len(needs))
			for _, k := range Components() {
				names = append(names, string(k))
			}
			return nil, fmt.Errorf("%w: %q (want %s)", ErrUnknownComponent, c, strings.Join(names, ", "))
		}
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out, nil
}

// validateRole checks a role name: a PostgreSQL identifier of at most 63
// bytes, printable, and not a reserved role (PUBLIC, pg_*). It is always
// quoted in SQL, so any such name is safe.
func validateRole(role string) error {
	switch {
	case role == "":
		return fmt.Errorf("%w: empty", ErrInvalidRole)
	case len(role) > 63:
		return fmt.Errorf("%w: %d bytes (at most 63)", ErrInvalidRole, len(role))
	case strings.EqualFold(role, "public") || strings.HasPrefix(strings.ToLower(role), "pg_"):
		return fmt.Errorf("%w: %q is reserved", ErrInvalidRole, role)
	case strings.IndexFunc(role, func(r rune) bool { return !unicode.IsPrint(r) || r == unicode.ReplacementChar }) >= 0:
		return fmt.Errorf("%w: %q has a control or invalid character", ErrInvalidRole, role)
	}
	return nil
}

// merged is the union of the components' table privileges, per table in
// the order the tables first appear.
func merged(components []Component) ([]tableGrant, error) {
	if len(components) == 0 {
		return nil, fmt.Errorf("%w: none given", ErrUnknownComponent)
	}
	var out []tableGrant
	for _, c := range components {
		tgs, ok := needs[c]
		if !ok {
			return nil, fmt.Errorf("%w: %q", ErrUnknownComponent, c)
		}
		for _, tg := range tgs {
			i := slices.IndexFunc(out, func(o tableGrant) bool { return o.table == tg.table })
			if i < 0 {
				out = append(out, tableGrant{table: tg.table})
				i = len(out) - 1
			}
			for _, p := range tg.privs {
				if !slices.Contains(out[i].privs, p) {
					out[i].privs = append(out[i].privs, p)
				}
			}
		}
	}
	for i := range out {
		slices.SortFunc(out[i].privs, func(a, b string) int { return privOrder(a) - privOrder(b) })
	}
	return out, nil
}

func privOrder(p string) int {
	return slices.Index([]string{"SELECT", "INSERT", "UPDATE", "DELETE"}, p)
}

// GrantSQL returns the statements that give role what components need in
// the schema (WithSchema), for teams that apply grants with their own tool:
// USAGE on the schema and the table privileges, nothing else (no CREATE, no
// sequence: identity columns need none). GRANT is idempotent. The role must
// exist; its name is quoted, never interpolated raw.
func GrantSQL(role string, components []Component, opts ...Option) (string, error) {
	stmts, err := grantStatements(role, components, opts)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	cs := make([]string, len(components))
	for i, c := range components {
		cs[i] = string(c)
	}
	fmt.Fprintf(&b, "-- oncekit: the privileges of %s for %s\n", pgx.Identifier{role}.Sanitize(), strings.Join(cs, ", "))
	if slices.Contains(components, LogicalRelay) {
		b.WriteString("-- The logical relay's role also needs the REPLICATION attribute (rds_replication on RDS,\n" +
			"-- cloudsqlsuperuser on Cloud SQL, ALTER ROLE ... REPLICATION elsewhere), granted apart.\n")
	}
	for _, s := range stmts {
		b.WriteString(s + ";\n")
	}
	return b.String(), nil
}

func grantStatements(role string, components []Component, opts []Option) ([]string, error) {
	schema, err := resolve(opts)
	if err != nil {
		return nil, err
	}
	if err := validateRole(role); err != nil {
		return nil, err
	}
	tgs, err := merged(components)
	if err != nil {
		return nil, err
	}
	r := pgx.Identifier{role}.Sanitize()
	stmts := []string{pgsql.Render("GRANT USAGE ON SCHEMA {schema} TO ", schema) + r}
	for _, tg := range tgs {
		stmts = append(stmts, fmt.Sprintf("GRANT %s ON %s.%s TO %s",
			strings.Join(tg.privs, ", "), pgsql.Render("{schema}", schema), tg.table, r))
	}
	return stmts, nil
}

// Grant gives role what components need in the schema (WithSchema), in one
// transaction: GrantSQL's statements. Run it as the schema's owner, after
// Up. The role must exist.
func Grant(ctx context.Context, db oncekit.Beginner, role string, components []Component, opts ...Option) error {
	stmts, err := grantStatements(role, components, opts)
	if err != nil {
		return err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrations: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("migrations: grant to %s: %w", pgx.Identifier{role}.Sanitize(), err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrations: commit: %w", err)
	}
	return nil
}
