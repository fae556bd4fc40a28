package main

import (
	"context"
	"fmt"

	"github.com/oncekit/oncekit/migrations"
)

func init() {
	register(&command{name: "migrate", summary: "apply, list or print the schema migrations (up | status | sql)", run: runMigrate})
}

func runMigrate(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "migrate", "migrate up|status|sql [flags]")
	var db dbFlags
	db.register(fs, e)
	sub, err := parseSubcommand(fs, args, "up, status or sql")
	if err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected arguments: %v", fs.Args())
	}
	if err := db.validate(); err != nil {
		return err
	}
	schema := migrations.WithSchema(db.schema())
	switch sub {
	case "sql":
		sql, err := migrations.SQL(schema)
		if err != nil {
			return err
		}
		fmt.Fprint(e.stdout, sql)
		return nil
	case "up", "status":
	default:
		return usagef("unknown subcommand %q: want up, status or sql", sub)
	}
	pool, err := db.openWith(ctx, false)
	if err != nil {
		return err
	}
	defer pool.Close()
	if sub == "up" {
		applied, err := migrations.Up(ctx, pool, schema)
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
	}
	st, err := migrations.Status(ctx, pool, schema)
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
}
