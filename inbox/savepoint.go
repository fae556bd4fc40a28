package inbox

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	pgx.Tx
	pending bool // the savepoint is still to be sent
	set     bool // the savepoint exists
}

func (s *savepointTx) Commit(context.Context) error   { return ErrTxOwned }
func (s *savepointTx) Rollback(context.Context) error { return ErrTxOwned }

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

func (s *savepointTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := s.ensure(ctx); err != nil {
		return nil, err
	}
	return s.Tx.Query(ctx, sql, args...)
}

func (s *savepointTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := s.ensure(ctx); err != nil {
		return errRow{err}
	}
	return s.Tx.QueryRow(ctx, sql, args...)
}

func (s *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := s.ensure(ctx); err != nil {
		return nil, err
	}
	return s.Tx.Begin(ctx)
}

func (s *savepointTx) CopyFrom(ctx context.Context, t pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := s.ensure(ctx); err != nil {
		return 0, err
	}
	return s.Tx.CopyFrom(ctx, t, cols, src)
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

func (s *savepointTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := s.ensure(ctx); err != nil {
		return nil, err
	}
	return s.Tx.Prepare(ctx, name, sql)
}

func (s *savepointTx) LargeObjects() pgx.LargeObjects {
	_ = s.ensure(context.Background())
	return s.Tx.LargeObjects()
}

func (s *savepointTx) Conn() *pgx.Conn {
	_ = s.ensure(context.Background())
	return s.Tx.Conn()
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

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow{b.err} }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }
