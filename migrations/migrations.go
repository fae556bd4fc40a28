package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/pgsql"
)

//go:embed *.sql
var files embed.FS

// Migration is one numbered schema change.
type Migration struct {
	Version int
	Name    string
	SQL     string // with "{schema}" placeholders
}

// State is a migration and whether it has been applied.
type State struct {
	Migration
	AppliedAt *time.Time // nil when pending
}

// Option configures Up, Status and SQL.
type Option func(*options)

type options struct {
	schema string
	target int
}

// WithSchema sets the schema oncekit's tables live in. Defaults to oncekit.DefaultSchema.
func WithSchema(name string) Option { return func(o *options) { o.schema = name } }

// WithTarget makes Up stop after migration version (for staged upgrades).
// Defaults to every migration.
func WithTarget(version int) Option { return func(o *options) { o.target = version } }

func resolve(opts []Option) (string, error) {
	schema, _, err := resolveAll(opts)
	return schema, err
}

func resolveAll(opts []Option) (string, options, error) {
	var o options
	for _, fn := range opts {
		fn(&o)
	}
	schema, err := pgsql.ValidateSchema(o.schema)
	return schema, o, err
}

// All returns every embedded migration in version order.
func All() []Migration {
	entries, err := fs.Glob(files, "*.sql")
	if err != nil {
		panic(err) // the pattern is constant
	}
	var ms []Migration
	for _, name := range entries {
		num, rest, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			panic(fmt.Sprintf("migrations: bad file name %q", name))
		}
		body, err := files.ReadFile(name)
		if err != nil {
			panic(err)
		}
		ms = append(ms, Migration{Version: v, Name: strings.TrimSuffix(rest, ".sql"), SQL: string(body)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	return ms
}

// SQL returns the DDL of every migration rendered for the schema, for teams
// that apply migrations with their own tool. It includes the bookkeeping table
// so that a later Up sees what was applied.
func SQL(opts ...Option) (string, error) {
	schema, err := resolve(opts)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(pgsql.Render(bootstrapSQL, schema))
	for _, m := range All() {
		fmt.Fprintf(&b, "\n-- %03d_%s\n%s\n", m.Version, m.Name, pgsql.Render(m.SQL, schema))
		fmt.Fprintf(&b, "INSERT INTO %s.schema_migrations (version, name) VALUES (%d, '%s') ON CONFLICT DO NOTHING;\n",
			pgsql.Render("{schema}", schema), m.Version, m.Name)
	}
	return b.String(), nil
}

const bootstrapSQL = `CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
	version    integer PRIMARY KEY,
	name       text NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
);
`

// lockKey is the advisory lock that serialises migration runs per schema.
func lockKey(schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("oncekit.migrate:" + schema))
	return int64(h.Sum64())
}

// Up applies every pending migration in order and returns the ones it
// applied (none on a second run). It runs in one transaction under an
// advisory lock, so concurrent callers wait and then find nothing to do, and a
// failure leaves the schema as it was.
func Up(ctx context.Context, db oncekit.Beginner, opts ...Option) ([]Migration, error) {
	schema, o, err := resolveAll(opts)
	if err != nil {
		return nil, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrations: begin: %w", err)
	}
	// A no-op after Commit; after a failure it ends the transaction even when
	// ctx is done.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	applied, err := apply(ctx, tx, schema, o.target)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("migrations: commit: %w", err)
	}
	return applied, nil
}

// apply takes the lock and applies the pending migrations in tx, up to
// target (0: all).
func apply(ctx context.Context, tx pgx.Tx, schema string, target int) ([]Migration, error) {
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockKey(schema)); err != nil {
		return nil, fmt.Errorf("migrations: lock: %w", err)
	}
	if _, err := tx.Exec(ctx, pgsql.Render(bootstrapSQL, schema)); err != nil {
		return nil, fmt.Errorf("migrations: bootstrap: %w", err)
	}
	done, err := appliedVersions(ctx, tx, schema)
	if err != nil {
		return nil, err
	}
	var applied []Migration
	for _, m := range All() {
		if _, ok := done[m.Version]; ok {
			continue
		}
		if target > 0 && m.Version > target {
			break
		}
		if _, err := tx.Exec(ctx, pgsql.Render(m.SQL, schema)); err != nil {
			return nil, fmt.Errorf("migrations: apply %03d_%s: %w", m.Version, m.Name, err)
		}
		if _, err := tx.Exec(ctx, pgsql.Render("INSERT INTO {schema}.schema_migrations (version, name) VALUES ($1, $2)", schema),
			m.Version, m.Name); err != nil {
			return nil, fmt.Errorf("migrations: record %03d: %w", m.Version, err)
		}
		applied = append(applied, m)
	}
	return applied, nil
}

// Status lists every known migration with the time it was applied, if it was.
func Status(ctx context.Context, db oncekit.Querier, opts ...Option) ([]State, error) {
	schema, err := resolve(opts)
	if err != nil {
		return nil, err
	}
	done, err := appliedVersions(ctx, db, schema)
	if err != nil {
		return nil, err
	}
	var out []State
	for _, m := range All() {
		s := State{Migration: m}
		if at, ok := done[m.Version]; ok {
			at := at
			s.AppliedAt = &at
		}
		out = append(out, s)
	}
	return out, nil
}

func appliedVersions(ctx context.Context, db oncekit.Querier, schema string) (map[int]time.Time, error) {
	var exists bool
	if err := db.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", `"`+schema+`".schema_migrations`).Scan(&exists); err != nil {
		return nil, fmt.Errorf("migrations: status: %w", err)
	}
	done := map[int]time.Time{}
	if !exists {
		return done, nil
	}
	rows, err := db.Query(ctx, pgsql.Render("SELECT version, applied_at FROM {schema}.schema_migrations", schema))
	if err != nil {
		return nil, fmt.Errorf("migrations: status: %w", err)
	}
	for rows.Next() {
		var v int
		var at time.Time
		if err := rows.Scan(&v, &at); err != nil {
			return nil, err
		}
		done[v] = at
	}
	if err := rows.Err(); err != nil {
		return nil, errors.Join(errors.New("migrations: status"), err)
	}
	return done, nil
}
