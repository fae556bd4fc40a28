package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/migrations"
)

// migrateSubcommands are up, which applies the migrations, status, which
// lists them, and sql, which prints them without connecting.
func migrateSubcommands(e *env, _ *flag.FlagSet, db *dbFlags) *subcommands {
	schema := func() migrations.Option { return migrations.WithSchema(db.schema()) }
	return &subcommands{
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
		},
	}
}
