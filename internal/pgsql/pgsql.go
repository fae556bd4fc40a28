// Package pgsql holds the schema every oncekit package's SQL is rendered
// for (validation, rendering), the classification of PostgreSQL's errors,
// and the running of a statement without JIT. The database interfaces the
// packages accept are public, in package oncekit.
package pgsql

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit"
)

// DefaultSchema is oncekit.DefaultSchema.
const DefaultSchema = oncekit.DefaultSchema

// ErrInvalidSchema is oncekit.ErrInvalidSchema.
var ErrInvalidSchema = oncekit.ErrInvalidSchema

// ValidateSchema is oncekit.ValidateSchema.
func ValidateSchema(name string) (string, error) { return oncekit.ValidateSchema(name) }

// Render replaces every "{schema}" in sql with the quoted schema name. The
// name must have passed ValidateSchema.
func Render(sql, schema string) string {
	return strings.ReplaceAll(sql, "{schema}", `"`+schema+`"`)
}

// IsUniqueViolation reports whether err is PostgreSQL's unique_violation.
func IsUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// Refused reports whether err is PostgreSQL refusing a statement for the
// data it carries, which sending it again cannot cure: a data exception
// (SQLSTATE class 22: invalid UTF-8, a NUL in text or jsonb, a value out of
// range), a program limit (class 54: an index row too large), or a NOT NULL
// or CHECK violation. A connection failure, a shutdown or a conflict is not.
func Refused(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch {
	case strings.HasPrefix(pgErr.Code, "22"), strings.HasPrefix(pgErr.Code, "54"):
		return true
	}
	return pgErr.Code == "23502" || pgErr.Code == "23514"
}

// noJIT turns JIT compilation off for the rest of the implicit transaction
// it runs in (or the explicit one, until it ends).
const noJIT = `SELECT set_config('jit', 'off', true)`

// batcher is implemented by *pgxpool.Pool, *pgx.Conn and pgx.Tx.
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// QueryRowNoJIT runs a one-row query with JIT compilation off and scans the
// row into dest. A count over a large table whose rows the planner cannot
// estimate (rows after a cursor, say) is priced past jit_above_cost, and
// PostgreSQL then spends hundreds of milliseconds compiling a query that
// runs in one. On a q that sends batches the setting travels in the same
// round trip; on any other q the query runs as it is.
func QueryRowNoJIT(ctx context.Context, q oncekit.Querier, sql string, args []any, dest ...any) error {
	b, ok := q.(batcher)
	if !ok {
		return q.QueryRow(ctx, sql, args...).Scan(dest...)
	}
	batch := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 2)}
	batch.Queue(noJIT)
	batch.Queue(sql, args...).QueryRow(func(row pgx.Row) error { return row.Scan(dest...) })
	return b.SendBatch(ctx, batch).Close()
}
