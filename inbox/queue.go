package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

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
// queuing. On any other transaction (the watermill middleware's, a caller's
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
	pgx.Tx           // where statements go: the transaction, or a message's savepointTx
	q      pgx.Batch // queued statements
	owners []int     // for each queued statement, the index of the message that queued it
	msg    int       // the index of the message whose handler runs

	failed int   // the message whose queued statement failed, or -1
	err    error // that statement's error
}

func newQueueTx(tx pgx.Tx) *queueTx { return &queueTx{Tx: tx, failed: -1} }

// on makes tx's statements go through to (the transaction, or a message's
// savepointTx) for message i's handler.
func (q *queueTx) on(to pgx.Tx, i int) *queueTx {
	q.Tx, q.msg = to, i
	return q
}

// reset discards what is queued and any failure, once the message's
// savepoint has undone it (or the transaction ends).
func (q *queueTx) reset() {
	q.q.QueuedQueries = q.q.QueuedQueries[:0]
	q.owners = q.owners[:0]
	q.failed, q.err = -1, nil
}

func (q *queueTx) Commit(context.Context) error   { return ErrTxOwned }
func (q *queueTx) Rollback(context.Context) error { return ErrTxOwned }

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
			return err
		}
		return errEarlierFailed
	}
	return nil
}

func (q *queueTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if q.q.Len() == 0 && q.failed < 0 {
		return q.Tx.Exec(ctx, sql, args...)
	}
	if err := q.ahead(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return q.Tx.Exec(ctx, sql, args...)
}

func (q *queueTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := q.ahead(ctx); err != nil {
		return nil, err
	}
	return q.Tx.Query(ctx, sql, args...)
}

func (q *queueTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := q.ahead(ctx); err != nil {
		return errRow{err}
	}
	return q.Tx.QueryRow(ctx, sql, args...)
}

func (q *queueTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := q.ahead(ctx); err != nil {
		return nil, err
	}
	return q.Tx.Begin(ctx)
}

func (q *queueTx) CopyFrom(ctx context.Context, t pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := q.ahead(ctx); err != nil {
		return 0, err
	}
	return q.Tx.CopyFrom(ctx, t, cols, src)
}

func (q *queueTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := q.ahead(ctx); err != nil {
		return errBatch{err}
	}
	return q.Tx.SendBatch(ctx, b)
}

func (q *queueTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := q.ahead(ctx); err != nil {
		return nil, err
	}
	return q.Tx.Prepare(ctx, name, sql)
}

func (q *queueTx) LargeObjects() pgx.LargeObjects {
	_ = q.ahead(context.Background())
	return q.Tx.LargeObjects()
}

// Conn sends the queued statements first, as the handler may use the
// connection directly.
func (q *queueTx) Conn() *pgx.Conn {
	_ = q.ahead(context.Background())
	return q.Tx.Conn()
}
