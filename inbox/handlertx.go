package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit/internal/pghook"
)

// The transaction a handler gets: its writes queued (Queue) to travel with
// the next statement sent, in a batch run with a savepoint per message
// under a savepoint of its own, and its end left to the Consumer.

// Queue runs sql in tx, like tx.Exec, for a write whose result the handler
// does not read. In a Consumer's transaction the statement is queued instead
// of sent: the queued statements of a batch travel together, in one round
// trip, with the next statement the transaction sends (a handler's own
// tx.Exec or tx.Query, or the consumer's commit at the latest), so a handler
// that only queues pays no round trip to PostgreSQL at all. That round trip
// is most of what a batch consumer's handler costs.
//
// Statements run in the order they were queued, and before any statement
// the handler (or a later message's handler) sends directly, so a handler
// can read what it queued. A queued statement that fails fails its message
// exactly as if the handler had returned the error: its work is rolled back
// and it is retried, or dead-lettered once it is Permanent or out of
// attempts, while the batch's other messages commit. Queue reports only an
// error of its own; the statement's error reaches the Consumer.
//
// The args are encoded when the statement is sent: do not change them after
// queuing. The handler_seconds metric times the handler, not the queued
// statements. On any other transaction (the watermill middleware's, a caller's
// own) Queue is tx.Exec and returns its error.
func Queue(ctx context.Context, tx pgx.Tx, sql string, args ...any) error {
	if q, ok := tx.(*queueTx); ok {
		q.q.Queue(sql, args...)
		q.owners = append(q.owners, q.msg)
		return nil
	}
	_, err := tx.Exec(ctx, sql, args...)
	return err
}

// errEarlierFailed is what a handler's statement returns when the queued
// statements sent ahead of it failed (they belong to an earlier message;
// the Consumer attributes the failure to that message).
var errEarlierFailed = errors.New("inbox: a statement queued by an earlier message failed")

// queueTx is the transaction a handler gets: it holds the statements queued
// with Queue and sends them ahead of anything else that goes through it.
// Ending the transaction is the Consumer's business (ErrTxOwned).
type queueTx struct {
	guardedTx              // to: the batch's transaction, or the message's savepointTx
	sp        *savepointTx // the message's savepoint, in a run with a savepoint per message
	q         pgx.Batch    // queued statements
	owners    []int        // for each queued statement, the index of the message that queued it
	msg       int          // the index of the message whose handler runs

	failed int   // the message whose queued statement failed, or -1
	err    error // that statement's error
}

// newQueueTx returns the transaction for the handlers of a batch, to be
// put on the batch's transaction for each message (on).
func newQueueTx() *queueTx {
	q := &queueTx{failed: -1}
	q.guardedTx = guardedTx{before: q.ahead}
	return q
}

// on makes tx's statements go, for message i's handler, through to the
// batch's transaction tx or, with savepoint, through a savepoint of the
// message's own over it (savepointTx).
func (q *queueTx) on(tx pgx.Tx, i int, savepoint bool) *queueTx {
	q.Tx, q.sp, q.msg = tx, nil, i
	if savepoint {
		q.sp = newSavepointTx(tx)
		q.Tx = q.sp
	}
	return q
}

// undo rolls the message's work back to its savepoint after it failed
// (savepointTx.undo); false: impossible, the whole batch must be retried.
func (q *queueTx) undo(ctx context.Context) bool { return q.sp.undo(ctx) }

// reset discards what is queued and any failure, once the message's
// savepoint has undone it (or the transaction ends).
func (q *queueTx) reset() {
	q.q.QueuedQueries = q.q.QueuedQueries[:0]
	q.owners = q.owners[:0]
	q.failed, q.err = -1, nil
}

// flush sends the queued statements, in one round trip, and reports the
// first failure (also kept in failed and err). After a failure the
// transaction is aborted: every later call fails with errEarlierFailed.
func (q *queueTx) flush(ctx context.Context) error {
	if q.failed >= 0 {
		return errEarlierFailed
	}
	n := q.q.Len()
	if n == 0 {
		return nil
	}
	br := q.Tx.SendBatch(ctx, &q.q)
	for i := range n {
		if _, err := br.Exec(); err != nil {
			q.failed, q.err = q.owners[i], fmt.Errorf("inbox: queued statement: %w", err)
			break
		}
	}
	cerr := br.Close()
	if q.failed < 0 && cerr != nil {
		q.failed, q.err = q.owners[n-1], fmt.Errorf("inbox: queued statements: %w", cerr)
	}
	q.q.QueuedQueries = q.q.QueuedQueries[:0]
	q.owners = q.owners[:0]
	if q.failed >= 0 {
		return q.err
	}
	return nil
}

// ahead flushes before a direct statement; a failure of another message's
// statement is reported to this handler as errEarlierFailed.
func (q *queueTx) ahead(ctx context.Context) error {
	if err := q.flush(ctx); err != nil {
		if q.failed == q.msg {
			return q.err
		}
		return errEarlierFailed
	}
	return nil
}

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
