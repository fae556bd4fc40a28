package oncekit

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Querier runs statements. pgx.Tx, *pgx.Conn, *pgxpool.Conn and
// *pgxpool.Pool all satisfy it, so the read and admin calls that take a
// Querier run in the caller's transaction when given one.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Beginner starts transactions. pgx.Tx (a nested transaction, as a
// savepoint), *pgx.Conn, *pgxpool.Conn and *pgxpool.Pool all satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// DB runs statements and begins transactions: what a component that makes
// its own transactions needs. *pgxpool.Pool is the usual one; *pgx.Conn,
// *pgxpool.Conn and pgx.Tx satisfy it too (a single connection serialises
// the component's work, and on a pgx.Tx its transactions are savepoints).
type DB interface {
	Querier
	Beginner
}

// Pool is a DB that also hands out connections of its own, for the
// components that hold one for a while: the outbox relay's LISTEN and the
// HTTP edge's same-transaction claim. *pgxpool.Pool satisfies it.
type Pool interface {
	DB
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}
