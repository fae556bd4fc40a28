package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
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
	guardedTx           // to: the transaction, or a message's savepointTx
	q         pgx.Batch // queued statements
	owners    []int     // for each queued statement, the index of the message that queued it
	msg       int       // the index of the message whose handler runs

	failed int   // the message whose queued statement failed, or -1
	err    error // that statement's error
}

func newQueueTx(tx pgx.Tx) *queueTx {
	q := &queueTx{failed: -1}
	q.guardedTx = guardedTx{Tx: tx, before: q.ahead}
	return q
}

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
