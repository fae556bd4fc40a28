package main

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/migrations"
)

// openFor is open for a daemon running as component: once connected, it
// checks that the role holds every privilege the component needs
// (migrations.CheckGrants), so that a role missing a grant stops the daemon
// at start with the privilege and table named and the command that grants
// it, instead of failing statement after statement.
func (d *dbFlags) openFor(ctx context.Context, c migrations.Component) (*pgxpool.Pool, error) {
	pool, err := d.openWith(ctx, false)
	if err != nil {
		return nil, err
	}
	if err := migrations.CheckGrants(ctx, pool, c, migrations.WithSchema(d.schema())); err != nil {
		pool.Close()
		return nil, err
	}
	if err := checkTables(ctx, pool, d.schema()); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}
