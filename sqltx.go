package oncekit

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A transaction of database/sql (sqlc, GORM, Bun, ent) joins oncekit's calls
// through FromSQLTx, and oncekit's own transactions (an inbox handler's, the
// HTTP edge's) reach database/sql code through WithSQLTx. Both run every
// statement on the one connection and in the one transaction.

var (
	// ErrNilTx reports a nil transaction given to FromSQLTx or WithSQLTx.
	ErrNilTx = errors.New("oncekit: nil transaction")
	// ErrNotPgx reports a *sql.Tx whose driver is not pgx's
	// (github.com/jackc/pgx/v5/stdlib): oncekit runs its statements on the
	// pgx connection under the transaction, and there is none.
	ErrNotPgx = errors.New("oncekit: the *sql.Tx's driver is not pgx's stdlib")
	// ErrNotInTransaction reports a *sql.Tx whose connection is no longer in
	// a transaction (a COMMIT or ROLLBACK statement was run through it).
	ErrNotInTransaction = errors.New("oncekit: the connection is not in a transaction")
	// ErrTxOwned reports a Commit or Rollback of a transaction that belongs
	// to another: the pgx.Tx of FromSQLTx belongs to its *sql.Tx, and the
	// *sql.Tx of WithSQLTx to its pgx.Tx.
	ErrTxOwned = errors.New("oncekit: the transaction is committed or rolled back by its owner")
)

// FromSQLTx returns a pgx.Tx that runs its statements in stx, a transaction
// opened through pgx's database/sql driver (stdlib.OpenDBFromPool,
// sql.Open("pgx", …)), for the calls that take a pgx.Tx: outbox Enqueue,
// the ledger's Record, inbox.Queue. No second connection is used: each
// statement is handed to the *pgx.Conn under stx while database/sql holds
// that connection for stx, so it runs after stx's earlier statements and
// before its Commit.
//
// stx stays the owner: commit or roll back stx, never the pgx.Tx (its
// Commit and Rollback return ErrTxOwned; its Begin makes a savepoint).
// Statements through stx and through the pgx.Tx may alternate, but read a
// Rows or BatchResults of the pgx.Tx to the end (or close it) before the
// next statement, as on any pgx connection. LargeObjects is not supported.
//
// FromSQLTx reports ErrNilTx for a nil stx, ErrNotPgx when stx's driver is
// not pgx's, an error wrapping sql.ErrTxDone when stx has already been
// committed or rolled back, and ErrNotInTransaction when its connection is
// not in a transaction. Each statement through the pgx.Tx checks the same,
// so one made after stx ended fails with sql.ErrTxDone instead of running
// outside the transaction. The check costs no round trip.
func FromSQLTx(ctx context.Context, stx *sql.Tx) (pgx.Tx, error) {
	if stx == nil {
		return nil, ErrNilTx
	}
	t := &sqlTx{stx: stx}
	switch err := t.on(ctx, func(c *pgx.Conn) error { t.conn = c; return nil }); {
	case errors.Is(err, ErrNotPgx), errors.Is(err, ErrNotInTransaction):
		return nil, err
	case err != nil:
		return nil, fmt.Errorf("oncekit: FromSQLTx: %w", err)
	}
	return t, nil
}

// reachSQL is the statement sent through the *sql.Tx to reach its pgx
// connection; reach replaces it before it is sent, so it never runs.
const reachSQL = "-- oncekit: reach the pgx connection"

// errReached ends the statement reach replaced: nothing is sent.
var errReached = errors.New("oncekit: pgx connection reached")

// reach is a pgx.QueryRewriter: pgx's stdlib driver gives it, as the first
// argument of a statement, to the *pgx.Conn under the *sql.Tx, whose Exec
// calls it with that connection before sending anything.
type reach struct {
	fn  func(*pgx.Conn) error
	ran *bool
	err *error
}

func (r reach) RewriteQuery(_ context.Context, c *pgx.Conn, _ string, _ []any) (string, []any, error) {
	*r.ran = true
	switch st := c.PgConn().TxStatus(); st {
	case 'T', 'E':
		*r.err = r.fn(c)
	default:
		*r.err = ErrNotInTransaction
	}
	return "", nil, errReached
}

// sqlTx is FromSQLTx's pgx.Tx.
type sqlTx struct {
	stx  *sql.Tx
	conn *pgx.Conn // the connection under stx, seen at FromSQLTx
	sp   atomic.Int64
}

// on runs fn with the pgx connection under t.stx, while database/sql holds
// it for t.stx (so t.stx can neither end nor run another statement).
func (t *sqlTx) on(ctx context.Context, fn func(*pgx.Conn) error) error {
	var ran bool
	var ferr error
	_, err := t.stx.ExecContext(ctx, reachSQL, reach{fn: fn, ran: &ran, err: &ferr})
	switch {
	case ran:
		return ferr
	case errors.Is(err, sql.ErrTxDone), ctx.Err() != nil:
		return err
	case err != nil:
		return fmt.Errorf("%w (%v)", ErrNotPgx, err)
	default:
		return ErrNotPgx
	}
}

func (t *sqlTx) Exec(ctx context.Context, sql string, args ...any) (tag pgconn.CommandTag, err error) {
	oerr := t.on(ctx, func(c *pgx.Conn) error { tag, err = c.Exec(ctx, sql, args...); return nil })
	if oerr != nil {
		return pgconn.CommandTag{}, oerr
	}
	return tag, err
}

func (t *sqlTx) Query(ctx context.Context, sql string, args ...any) (rows pgx.Rows, err error) {
	oerr := t.on(ctx, func(c *pgx.Conn) error { rows, err = c.Query(ctx, sql, args...); return nil })
	if oerr != nil {
		return nil, oerr
	}
	return rows, err
}

func (t *sqlTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	var row pgx.Row
	if err := t.on(ctx, func(c *pgx.Conn) error { row = c.QueryRow(ctx, sql, args...); return nil }); err != nil {
		return errRow{err}
	}
	return row
}

func (t *sqlTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	var br pgx.BatchResults
	if err := t.on(ctx, func(c *pgx.Conn) error { br = c.SendBatch(ctx, b); return nil }); err != nil {
		return errBatch{err}
	}
	return br
}

func (t *sqlTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (n int64, err error) {
	oerr := t.on(ctx, func(c *pgx.Conn) error { n, err = c.CopyFrom(ctx, table, cols, src); return nil })
	if oerr != nil {
		return 0, oerr
	}
	return n, err
}

func (t *sqlTx) Prepare(ctx context.Context, name, sql string) (sd *pgconn.StatementDescription, err error) {
	oerr := t.on(ctx, func(c *pgx.Conn) error { sd, err = c.Prepare(ctx, name, sql); return nil })
	if oerr != nil {
		return nil, oerr
	}
	return sd, err
}

// Begin makes a savepoint: its Commit releases it, its Rollback rolls back
// to it.
func (t *sqlTx) Begin(ctx context.Context) (pgx.Tx, error) {
	name := "oncekit_sp_" + strconv.FormatInt(t.sp.Add(1), 10)
	if _, err := t.Exec(ctx, "SAVEPOINT "+name); err != nil {
		return nil, err
	}
	return &savepoint{sqlTx: t, name: name}, nil
}

func (t *sqlTx) Commit(context.Context) error   { return ErrTxOwned }
func (t *sqlTx) Rollback(context.Context) error { return ErrTxOwned }

// LargeObjects is not supported: its methods fail.
func (t *sqlTx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }

// Conn is the connection under the *sql.Tx. Statements sent on it directly
// skip the check that the *sql.Tx is still open.
func (t *sqlTx) Conn() *pgx.Conn { return t.conn }

// savepoint is a pgx.Tx nested in a sqlTx.
type savepoint struct {
	*sqlTx
	name   string
	closed bool
}

func (s *savepoint) Commit(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.sqlTx.Exec(ctx, "RELEASE SAVEPOINT "+s.name)
	return err
}

func (s *savepoint) Rollback(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.sqlTx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+s.name)
	return err
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow(b) }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }
