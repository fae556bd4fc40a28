package oncekit

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// WithSQLTx runs fn with a *sql.Tx whose statements run in tx, for
// database/sql code (sqlc, GORM, Bun, ent) in a transaction oncekit opened:
// an inbox handler's, or the HTTP edge's same-transaction mode
// (idempotency.Tx). The *sql.Tx is tx seen through database/sql: every
// statement goes through tx, on its connection, so fn's writes commit or
// roll back with tx, and no connection is taken from a pool.
//
// fn must not commit or roll back the *sql.Tx (tx's owner does; both
// return ErrTxOwned, and WithSQLTx then fails with it): to undo its
// writes, fn returns an error, which WithSQLTx returns. The *sql.Tx is
// valid during fn only. Arguments pass through to pgx unchanged; columns
// scan as pgx decodes them, with integers as int64, uuid as its text,
// json as its bytes and numeric as its text; arrays and other composite
// types are not supported. WithSQLTx reports ErrNilTx for a nil tx.
func WithSQLTx(ctx context.Context, tx pgx.Tx, fn func(*sql.Tx) error) error {
	if tx == nil {
		return ErrNilTx
	}
	c := &txConn{tx: tx}
	db := sql.OpenDB(txConnector{c})
	defer db.Close()
	db.SetMaxOpenConns(1)
	stx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("oncekit: WithSQLTx: %w", err)
	}
	if err := fn(stx); err != nil {
		c.fnDone.Store(true)
		_ = stx.Rollback()
		return err
	}
	c.fnDone.Store(true)
	if err := stx.Rollback(); err != nil || c.ended.Load() {
		return fmt.Errorf("oncekit: WithSQLTx: fn ended the *sql.Tx: %w", ErrTxOwned)
	}
	return nil
}

// txConnector hands database/sql its one connection.
type txConnector struct{ c *txConn }

func (t txConnector) Connect(context.Context) (driver.Conn, error) { return t.c, nil }
func (t txConnector) Driver() driver.Driver                        { return txDriver{} }

type txDriver struct{}

func (txDriver) Open(string) (driver.Conn, error) {
	return nil, errors.New("oncekit: WithSQLTx's driver opens no connection")
}

// txConn is a database/sql driver connection whose statements run in tx.
type txConn struct {
	tx     pgx.Tx
	ended  atomic.Bool // fn committed or rolled back its *sql.Tx
	fnDone atomic.Bool // fn has returned: WithSQLTx ends the *sql.Tx
}

func (c *txConn) Prepare(query string) (driver.Stmt, error) { return txStmt{c, query}, nil }
func (c *txConn) Close() error                              { return nil }
func (c *txConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *txConn) BeginTx(_ context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if opts.Isolation != driver.IsolationLevel(sql.LevelDefault) || opts.ReadOnly {
		return nil, errors.New("oncekit: WithSQLTx: the transaction is begun already: no isolation or read-only option applies")
	}
	return &txEnd{c: c}, nil
}

// CheckNamedValue passes every argument to pgx, which encodes it.
func (c *txConn) CheckNamedValue(*driver.NamedValue) error { return nil }

func (c *txConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	tag, err := c.tx.Exec(ctx, query, values(args)...)
	if err != nil {
		return nil, err
	}
	return driver.RowsAffected(tag.RowsAffected()), nil
}

func (c *txConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	rows, err := c.tx.Query(ctx, query, values(args)...)
	if err != nil {
		return nil, err
	}
	// Read the first row now: a statement's error shows here, as with
	// pgx's stdlib driver.
	more := rows.Next()
	if err := rows.Err(); err != nil {
		rows.Close()
		return nil, err
	}
	return &txRows{rows: rows, first: true, more: more}, nil
}

func values(args []driver.NamedValue) []any {
	out := make([]any, len(args))
	for i, a := range args {
		out[i] = a.Value
	}
	return out
}

// txEnd is the driver's side of fn's *sql.Tx: it ends nothing.
type txEnd struct{ c *txConn }

func (e *txEnd) Commit() error   { return e.end() }
func (e *txEnd) Rollback() error { return e.end() }

func (e *txEnd) end() error {
	if !e.c.fnDone.Load() {
		e.c.ended.Store(true)
		return ErrTxOwned
	}
	return nil
}

type txStmt struct {
	c     *txConn
	query string
}

func (s txStmt) Close() error  { return nil }
func (s txStmt) NumInput() int { return -1 }
func (s txStmt) Exec([]driver.Value) (driver.Result, error) {
	return nil, errors.New("oncekit: WithSQLTx: use ExecContext")
}
func (s txStmt) Query([]driver.Value) (driver.Rows, error) {
	return nil, errors.New("oncekit: WithSQLTx: use QueryContext")
}
func (s txStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	return s.c.ExecContext(ctx, s.query, args)
}
func (s txStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	return s.c.QueryContext(ctx, s.query, args)
}

// txRows is a pgx.Rows read by database/sql.
type txRows struct {
	rows        pgx.Rows
	first, more bool // the first row, read by QueryContext
}

func (r *txRows) Columns() []string {
	fds := r.rows.FieldDescriptions()
	out := make([]string, len(fds))
	for i, fd := range fds {
		out[i] = fd.Name
	}
	return out
}

func (r *txRows) Close() error {
	r.rows.Close()
	return r.rows.Err()
}

func (r *txRows) Next(dest []driver.Value) error {
	if r.first {
		r.first = false
		if !r.more {
			return io.EOF
		}
	} else if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return io.EOF
	}
	vals, err := r.rows.Values()
	if err != nil {
		return err
	}
	fds := r.rows.FieldDescriptions()
	for i := range dest {
		if dest[i], err = driverValue(fds[i].DataTypeOID, vals[i]); err != nil {
			return fmt.Errorf("oncekit: WithSQLTx: column %q: %w", fds[i].Name, err)
		}
	}
	return nil
}

// driverValue is v, as pgx decoded it, as a value database/sql scans.
func driverValue(oid uint32, v any) (driver.Value, error) {
	if oid == pgtype.JSONOID || oid == pgtype.JSONBOID {
		if v == nil {
			return nil, nil
		}
		return json.Marshal(v)
	}
	switch x := v.(type) {
	case nil, int64, float64, bool, []byte, string, time.Time:
		return x, nil
	case int16:
		return int64(x), nil
	case int32:
		return int64(x), nil
	case uint32:
		return int64(x), nil
	case float32:
		return float64(x), nil
	case [16]byte:
		return uuid.UUID(x).String(), nil
	case netip.Prefix:
		return x.String(), nil
	case netip.Addr:
		return x.String(), nil
	case driver.Valuer:
		return x.Value()
	}
	return nil, fmt.Errorf("unsupported type %T", v)
}
