package inbox

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit/internal/pghook"
)

const (
	savepointSQL   = "SAVEPOINT inbox_msg"
	rollbackToSQL  = "ROLLBACK TO SAVEPOINT inbox_msg"
	txStatusFailed = 'E'
)

// savepointTx is a handler's transaction in batch mode. The message's
// SAVEPOINT is sent in the same round trip as the handler's first Exec (or
// just before any other first call), so that a savepoint per message costs
// no extra round trip; a handler that writes nothing never sets one.
// Ending the transaction is the Consumer's business (ErrTxOwned).
type savepointTx struct {
	guardedTx
	pending bool // the savepoint is still to be sent
	set     bool // the savepoint exists
}

// newSavepointTx returns tx for one message's handler, its savepoint
// pending.
func newSavepointTx(tx pgx.Tx) *savepointTx {
	s := &savepointTx{pending: true}
	s.guardedTx = guardedTx{Tx: tx, before: s.ensure}
	return s
}

// ensure sends the savepoint if it is still pending.
func (s *savepointTx) ensure(ctx context.Context) error {
	if !s.pending {
		return nil
	}
	s.pending = false
	if _, err := s.Tx.Exec(ctx, savepointSQL); err != nil {
		return err
	}
	s.set = true
	return nil
}

// Exec pipelines the pending savepoint with the statement.
func (s *savepointTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if !s.pending {
		return s.Tx.Exec(ctx, sql, args...)
	}
	s.pending = false
	b := &pgx.Batch{}
	b.Queue(savepointSQL)
	b.Queue(sql, args...)
	br := s.Tx.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return pgconn.CommandTag{}, err
	}
	s.set = true
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// SendBatch pipelines the pending savepoint ahead of b's statements.
func (s *savepointTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if !s.pending {
		return s.Tx.SendBatch(ctx, b)
	}
	s.pending = false
	sb := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, b.Len()+1)}
	sb.Queue(savepointSQL)
	sb.QueuedQueries = append(sb.QueuedQueries, b.QueuedQueries...)
	br := s.Tx.SendBatch(ctx, sb)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return errBatch{err}
	}
	s.set = true
	return br
}

// undo rolls the handler's work back after it failed. It reports false when
// that is impossible (the transaction is aborted with no savepoint to return
// to): the whole batch must then be retried.
func (s *savepointTx) undo(ctx context.Context) bool {
	if s.set {
		_, err := s.Tx.Exec(ctx, rollbackToSQL)
		return err == nil
	}
	return s.Tx.Conn().PgConn().TxStatus() != txStatusFailed
}

type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return pghook.ErrRow{Err: b.err} }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }

// guardedTx is a handler's transaction that runs before ahead of every
// statement sent through it: a pending savepoint, queued statements.
type guardedTx struct {
	pgx.Tx
	before func(ctx context.Context) error
}

// hooked is Tx with before ahead of its statements. Tx changes (queueTx.on),
// so it is made for each statement.
func (g *guardedTx) hooked() pghook.Hooked { return pghook.Hooked{Q: g.Tx, Before: g.before} }

func (g *guardedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return g.hooked().Exec(ctx, sql, args...)
}

func (g *guardedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return g.hooked().Query(ctx, sql, args...)
}

func (g *guardedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return g.hooked().QueryRow(ctx, sql, args...)
}

func (g *guardedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := g.before(ctx); err != nil {
		return nil, err
	}
	return g.Tx.Begin(ctx)
}

func (g *guardedTx) CopyFrom(ctx context.Context, t pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := g.before(ctx); err != nil {
		return 0, err
	}
	return g.Tx.CopyFrom(ctx, t, cols, src)
}

func (g *guardedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := g.before(ctx); err != nil {
		return errBatch{err}
	}
	return g.Tx.SendBatch(ctx, b)
}

func (g *guardedTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := g.before(ctx); err != nil {
		return nil, err
	}
	return g.Tx.Prepare(ctx, name, sql)
}

func (g *guardedTx) LargeObjects() pgx.LargeObjects {
	_ = g.before(context.Background())
	return g.Tx.LargeObjects()
}

// Conn runs before first, as the handler may use the connection directly.
func (g *guardedTx) Conn() *pgx.Conn {
	_ = g.before(context.Background())
	return g.Tx.Conn()
}

// Commit and Rollback are the Consumer's business.
func (g *guardedTx) Commit(context.Context) error   { return ErrTxOwned }
func (g *guardedTx) Rollback(context.Context) error { return ErrTxOwned }
