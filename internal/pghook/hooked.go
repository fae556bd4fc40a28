package pghook

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit"
)

// Hooked is a Querier that runs Before ahead of every statement it sends to
// Q: a statement whose Before fails is not sent, and returns that error.
// Spaced waits for a statement's turn with it; the inbox's handler
// transactions send a pending savepoint with it.
type Hooked struct {
	Q      oncekit.Querier
	Before func(ctx context.Context) error
}

// Exec runs Before, then Q.Exec.
func (h Hooked) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := h.Before(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return h.Q.Exec(ctx, sql, args...)
}

// Query runs Before, then Q.Query.
func (h Hooked) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := h.Before(ctx); err != nil {
		return nil, err
	}
	return h.Q.Query(ctx, sql, args...)
}

// QueryRow runs Before, then Q.QueryRow; a Before error is the row's Scan
// error.
func (h Hooked) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := h.Before(ctx); err != nil {
		return ErrRow{err}
	}
	return h.Q.QueryRow(ctx, sql, args...)
}

// ErrRow is a pgx.Row whose Scan returns Err.
type ErrRow struct{ Err error }

// Scan returns r.Err.
func (r ErrRow) Scan(...any) error { return r.Err }
