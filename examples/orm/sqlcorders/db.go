// Code in the shape sqlc generates from query.sql (see sqlc.yaml).

package sqlcorders

import (
	"context"
	"database/sql"
)

// DBTX is what the queries run on: a *sql.DB or a *sql.Tx.
type DBTX interface {
	ExecContext(context.Context, string, ...interface{}) (sql.Result, error)
	PrepareContext(context.Context, string) (*sql.Stmt, error)
	QueryContext(context.Context, string, ...interface{}) (*sql.Rows, error)
	QueryRowContext(context.Context, string, ...interface{}) *sql.Row
}

// New returns the queries on db.
func New(db DBTX) *Queries {
	return &Queries{db: db}
}

// Queries runs the queries of query.sql.
type Queries struct {
	db DBTX
}

// WithTx returns the queries on tx.
func (q *Queries) WithTx(tx *sql.Tx) *Queries {
	return &Queries{
		db: tx,
	}
}
