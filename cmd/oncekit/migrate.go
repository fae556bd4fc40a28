package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/migrations"
)

// migrateUsage is the usage of `oncekit migrate`.
const migrateUsage = "migrate up|status|sql|grant [flags]"

// migrateSubcommands are up, which applies the migrations, status, which
// lists them, sql, which prints them without connecting, and grant, which
// gives a runtime role what its components need (or prints the statements).
func migrateSubcommands(e *env, _ *flag.FlagSet, db *dbFlags) *subcommands {
	schema := func() migrations.Option { return migrations.WithSchema(db.schema()) }
	var g grantFlags
	return &subcommands{
		flagsPerSubcommand: true,
		check: func(args []string) error {
			if err := noArguments(args); err != nil {
				return err
			}
			return db.validate()
		},
		tablesOptional: true,
		list: []subcommand{
			{name: "up", run: func(ctx context.Context, pool *pgxpool.Pool) error {
				applied, err := migrations.Up(ctx, pool, schema())
				if err != nil {
					return err
				}
				if len(applied) == 0 {
					fmt.Fprintf(e.stdout, "schema %s is up to date\n", db.schema())
				}
				for _, m := range applied {
					fmt.Fprintf(e.stdout, "applied %03d_%s\n", m.Version, m.Name)
				}
				return nil
			}},
			{name: "status", run: func(ctx context.Context, pool *pgxpool.Pool) error {
				st, err := migrations.Status(ctx, pool, schema())
				if err != nil {
					return err
				}
				for _, s := range st {
					state := "pending"
					if s.AppliedAt != nil {
						state = "applied " + s.AppliedAt.UTC().Format("2006-01-02 15:04:05Z")
					}
					fmt.Fprintf(e.stdout, "%03d_%-20s %s\n", s.Version, s.Name, state)
				}
				return nil
			}},
			{name: "sql", offline: true, run: func(context.Context, *pgxpool.Pool) error {
				sql, err := migrations.SQL(schema())
				if err != nil {
					return err
				}
				fmt.Fprint(e.stdout, sql)
				return nil
			}},
			{name: "grant", flags: g.register, check: g.check, offline: true, run: func(ctx context.Context, _ *pgxpool.Pool) error {
				return g.run(ctx, e, db)
			}},
		},
	}
}

// grantFlags are the flags of `oncekit migrate grant`.
type grantFlags struct {
	role, components *string
	sqlOnly          *bool
	parsed           []migrations.Component
}

func (g *grantFlags) register(fs *flag.FlagSet) {
	g.role = fs.String("role", "", "`ROLE` to grant to (it must exist; the command never creates roles)")
	g.components = fs.String("for", "", "comma-separated `COMPONENTS` the role runs: producer, relay, logical-relay, consumer, dispatcher, edge, console, console-write, drift")
	g.sqlOnly = fs.Bool("sql", false, "print the GRANT statements instead of applying them (no connection)")
}

func (g *grantFlags) check([]string) error {
	if *g.role == "" {
		return usagef("--role is required")
	}
	if *g.components == "" {
		return usagef("--for is required: the components the role runs")
	}
	var err error
	if g.parsed, err = migrations.ParseComponents(*g.components); err != nil {
		return usagef("--for: %v", err)
	}
	if _, err := migrations.GrantSQL(*g.role, g.parsed); err != nil {
		return usagef("--role: %v", err)
	}
	return nil
}

// run prints the statements with --sql, else applies them as the connected
// role (the schema's owner) and prints what it granted.
func (g *grantFlags) run(ctx context.Context, e *env, db *dbFlags) error {
	sql, err := migrations.GrantSQL(*g.role, g.parsed, migrations.WithSchema(db.schema()))
	if err != nil {
		return err
	}
	if *g.sqlOnly {
		fmt.Fprint(e.stdout, sql)
		return nil
	}
	pool, err := db.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrations.Grant(ctx, pool, *g.role, g.parsed, migrations.WithSchema(db.schema())); err != nil {
		return err
	}
	fmt.Fprint(e.stdout, sql)
	fmt.Fprintf(e.stdout, "granted to %s in schema %s\n", *g.role, db.schema())
	return nil
}
