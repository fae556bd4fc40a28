package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit/internal/crashpoint"
	"github.com/oncekit/oncekit/internal/pgsql"
)

// Crash points on the processing path, for crash tests that kill the process
// there (ONCEKIT_CRASHPOINT names one of them).
const (
	CrashBeforeCommit = "inbox.before-commit"
	CrashAfterCommit  = "inbox.after-commit"
)

type outcomeKind int

const (
	outPending outcomeKind = iota // not decided yet
	outProcessed
	outDuplicate
	outDead
	outRetry
	outSkip    // ordered: waits behind a failed message of its key
	outUnknown // commit outcome unknown: left for redelivery
)

type outcome struct {
	kind   outcomeKind
	reason string // outDead
	kindOf string // outDead metric label
	err    error  // outRetry
}

// call runs the handler with tx and the message's trace context, turning a
// panic into an error.
func (c *Consumer) call(ctx context.Context, tx pgx.Tx, msg *Message) (err error) {
	ctx = c.cfg.Propagator.Extract(ctx, msg.Headers)
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrPanic, r)
		}
		c.m.handlerSeconds.Observe(time.Since(start).Seconds())
	}()
	return c.h.Handle(ctx, tx, msg)
}

// failure decides what a handler error means for it: dead letter or retry.
func (c *Consumer) failure(it *item, err error) outcome {
	switch {
	case IsPermanent(err):
		return outcome{kind: outDead, reason: err.Error(), kindOf: "permanent", err: err}
	case it.attempt >= c.cfg.MaxAttempts:
		return outcome{kind: outDead, reason: reasonMaxAttempts + err.Error(), kindOf: "max_attempts", err: err}
	default:
		return outcome{kind: outRetry, err: err}
	}
}

func deadKind(reason string) string {
	if reason == ReasonNoID {
		return "no_id"
	}
	return "invalid_id"
}

func (c *Consumer) deadLetter(it *item, reason string) DeadLetter {
	return DeadLetter{
		Consumer: c.cfg.Name, MessageID: it.rawID, Subject: it.d.Subject(), Payload: it.d.Data(),
		Headers: it.d.Headers(), Reason: reason, Attempts: it.attempt,
	}
}

// definiteRollback reports whether a failed COMMIT certainly did not commit:
// the server answered with an ERROR (a serialization failure, a deferred
// constraint), or pgx saw the transaction already aborted. A broken
// connection, and a FATAL or PANIC (the backend was terminated, possibly
// after committing locally), are unknown outcomes.
func definiteRollback(err error) bool {
	if errors.Is(err, pgx.ErrTxCommitRollback) {
		return true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	// SeverityUnlocalized is never translated (PostgreSQL ≥ 9.6); Severity
	// is in the server's language.
	sev := pgErr.SeverityUnlocalized
	if sev == "" {
		sev = pgErr.Severity
	}
	return sev == "ERROR"
}

// process runs one batch (often of one) in one transaction and settles every
// message with the broker. In ordered mode it returns, in order, the
// messages to retry in place instead of asking for redelivery.
func (c *Consumer) process(ctx context.Context, items []*item) []*item {
	c.m.batchSize.Observe(float64(len(items)))
	for _, it := range items {
		if it.msg != nil {
			it.msg.Attempt = it.attempt
		}
	}
	out := make([]outcome, len(items))
	if err := c.runBatch(ctx, items, out); err != nil {
		for i := range out {
			if out[i].kind != outDuplicate {
				out[i] = outcome{kind: outRetry, err: err}
			}
		}
	}
	return c.settle(ctx, items, out)
}

// failureCooldown is how many batches run with a savepoint per message after
// a handler failed in a batch, before running without savepoints again.
const failureCooldown = 16

// maxSavepoints bounds the messages of one transaction that runs a savepoint
// per message: PostgreSQL caches 64 subtransactions per backend, and past
// that every other backend's snapshots get slower while the transaction is
// open. A larger batch runs its savepoints in several transactions.
const maxSavepoints = 64

// runBatch fills out. A batch first runs without savepoints, which cost
// PostgreSQL a subtransaction per message. If a handler fails, nothing of the
// batch can be kept (its work is mixed with the others'): the transaction is
// rolled back, the failure's outcome kept, and the batch runs again minus
// that message, with a savepoint per message, so that another failure undoes
// only itself. The handlers that ran before the failure run again, in the new
// transaction; the first one's writes were rolled back. While failures are
// recent the savepoints are kept from the start. An error means the
// transaction as a whole failed: the caller retries every message that is
// not a duplicate.
func (c *Consumer) runBatch(ctx context.Context, items []*item, out []outcome) error {
	if len(items) == 1 {
		_, err := c.runTx(ctx, items, out, true, nil)
		return err
	}
	if c.failureCooldown.Load() > 0 {
		c.failureCooldown.Add(-1)
	} else {
		failed, err := c.runTx(ctx, items, out, false, nil)
		if err != nil || failed < 0 {
			return err
		}
		c.failureCooldown.Store(failureCooldown)
		for i, it := range items {
			switch {
			case i == failed:
			case it.msg != nil && it.msg.ID == items[failed].msg.ID:
				// A copy of the failed message (only the first copy
				// runs): acked, as the failed one comes back.
				out[i] = outcome{kind: outDuplicate}
			default:
				out[i] = outcome{}
			}
		}
	}
	if len(items) <= maxSavepoints {
		_, err := c.runTx(ctx, items, out, true, nil)
		return err
	}
	// In parts of at most maxSavepoints, each its own transaction; in
	// ordered mode a key held back by a part holds the later parts too.
	blocked := map[string]bool{}
	for lo := 0; lo < len(items); lo += maxSavepoints {
		part, pout := items[lo:min(lo+maxSavepoints, len(items))], out[lo:min(lo+maxSavepoints, len(items))]
		if _, err := c.runTx(ctx, part, pout, true, blocked); err != nil {
			for i := range pout {
				if pout[i].kind != outDuplicate {
					pout[i] = outcome{kind: outRetry, err: err}
				}
			}
		}
		for i, it := range part {
			switch pout[i].kind {
			case outRetry, outSkip, outUnknown:
				if it.msg != nil && it.msg.Key != "" {
					blocked[it.msg.Key] = true
				}
			}
		}
	}
	return nil
}

// runTx runs the pending messages of items in one transaction and fills their
// outcomes; a message whose outcome is already set (a handler failure from a
// run without savepoints, or a copy of it) is not claimed, and the failure is
// dead-lettered in this transaction if that is its outcome. In ordered mode
// the messages whose key is in blocked (nil: none) wait behind an earlier
// failure. With savepoints false, a handler failure rolls the transaction
// back at once and runTx returns the failed message's index (its outcome set,
// the others' to be discarded); otherwise it returns -1. An error means the
// transaction as a whole failed.
func (c *Consumer) runTx(ctx context.Context, items []*item, out []outcome, savepoints bool, blocked map[string]bool) (failed int, err error) {
	tx, claimed, err := c.beginClaim(ctx, items, out)
	if err != nil {
		return -1, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	single := len(items) == 1
	seen := make(map[uuid.UUID]bool, len(items))
	if blocked == nil {
		blocked = map[string]bool{}
	}
	var release []uuid.UUID
	var dead []DeadLetter
	q := newQueueTx(tx)
	for i, it := range items {
		switch o := out[i]; o.kind {
		case outPending:
		case outDead: // failed in the run before this one
			dead = append(dead, c.deadLetter(it, o.reason))
			continue
		case outRetry: // failed in the run before this one
			if it.msg.Key != "" {
				blocked[it.msg.Key] = true
			}
			continue
		default: // a copy of the message that failed in the run before
			continue
		}
		if it.reason != "" {
			out[i] = outcome{kind: outDead, reason: it.reason, kindOf: deadKind(it.reason)}
			dead = append(dead, c.deadLetter(it, it.reason))
			continue
		}
		id := it.msg.ID
		first := !seen[id]
		seen[id] = true
		if claimed != nil && (!claimed[id] || !first) {
			out[i] = outcome{kind: outDuplicate}
			continue
		}
		if c.cfg.Ordered && blocked[it.msg.Key] && it.msg.Key != "" {
			out[i] = outcome{kind: outSkip}
			release = append(release, id)
			continue
		}
		var to pgx.Tx = tx
		var sp *savepointTx
		if savepoints && !single {
			sp = newSavepointTx(tx)
			to = sp
		}
		herr := c.call(ctx, q.on(to, i), it.msg)
		if sp != nil || single {
			// What the message queued goes now, under its savepoint (or
			// alone), unless the handler failed.
			if herr == nil {
				herr = q.flush(ctx)
			}
			q.reset()
		} else if q.failed >= 0 {
			// A statement queued by this message or an earlier one failed
			// when this handler sent one of its own.
			return c.queueFailed(ctx, tx, items, out, q), nil
		}
		if herr == nil {
			out[i] = outcome{kind: outProcessed}
			continue
		}
		out[i] = c.failure(it, herr)
		if !single && sp == nil {
			// No savepoint to return to: the caller runs the batch again.
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return i, nil
		}
		if single {
			// Nothing else rides in this transaction: end it, and write a
			// dead letter (without the claim) on its own.
			_ = tx.Rollback(context.WithoutCancel(ctx))
			if out[i].kind == outDead {
				if _, derr := c.store.InsertDeadLetter(ctx, c.db, c.deadLetter(it, out[i].reason)); derr != nil {
					out[i] = outcome{kind: outRetry, err: errors.Join(herr, derr)}
				}
			}
			return -1, nil
		}
		if !sp.undo(ctx) {
			return -1, fmt.Errorf("inbox: cannot roll back to the message's savepoint: %w", herr)
		}
		if claimed != nil {
			release = append(release, id)
		}
		if out[i].kind == outDead {
			dead = append(dead, c.deadLetter(it, out[i].reason))
		} else if it.msg.Key != "" {
			blocked[it.msg.Key] = true
		}
	}
	if q.flush(ctx) != nil {
		return c.queueFailed(ctx, tx, items, out, q), nil
	}
	if claimed != nil && len(release) > 0 {
		if err := c.store.unclaimAll(ctx, tx, c.cfg.Name, release); err != nil {
			return -1, err
		}
	}
	for _, dl := range dead {
		if _, err := c.store.InsertDeadLetter(ctx, tx, dl); err != nil {
			return -1, err
		}
	}
	crashpoint.Hit(CrashBeforeCommit)
	if err := tx.Commit(ctx); err != nil {
		if definiteRollback(err) {
			return -1, fmt.Errorf("inbox: commit: %w", err)
		}
		c.log.Error("inbox commit outcome unknown; leaving the messages to redelivery", "err", err, "messages", len(items))
		for i := range out {
			if out[i].kind != outDuplicate {
				out[i] = outcome{kind: outUnknown, err: err}
			}
		}
		return -1, nil
	}
	crashpoint.Hit(CrashAfterCommit)
	return -1, nil
}

// queueFailed rolls back a batch run without savepoints whose queued
// statement failed, gives the failure to the message that queued it, and
// returns that message's index (runTx's failed).
func (c *Consumer) queueFailed(ctx context.Context, tx pgx.Tx, items []*item, out []outcome, q *queueTx) int {
	_ = tx.Rollback(context.WithoutCancel(ctx))
	out[q.failed] = c.failure(items[q.failed], q.err)
	return q.failed
}

// batchSender sends a batch of statements in one round trip; a
// *pgxpool.Pool and a *pgx.Conn are.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// beginClaim begins the transaction and claims every valid message of items
// whose outcome is pending, in one round trip when the database can
// pipeline. The claims map is nil when claims are off.
func (c *Consumer) beginClaim(ctx context.Context, items []*item, out []outcome) (pgx.Tx, map[uuid.UUID]bool, error) {
	ids := make([]uuid.UUID, 0, len(items))
	for i, it := range items {
		if it.msg != nil && out[i].kind == outPending {
			ids = append(ids, it.msg.ID)
		}
	}
	bs, pipelined := c.db.(batchSender)
	if c.cfg.DisableClaim || len(ids) == 0 || !pipelined {
		tx, err := c.db.Begin(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("inbox: begin: %w", err)
		}
		var claimed map[uuid.UUID]bool
		switch {
		case c.cfg.DisableClaim:
		case len(ids) == 0:
			claimed = map[uuid.UUID]bool{}
		default:
			claimed, err = c.store.claimAll(ctx, tx, c.cfg.Name, ids)
		}
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return nil, nil, err
		}
		return withUUIDCodec(tx), claimed, nil
	}
	// Expect new messages (a plain INSERT) unless a duplicate was seen
	// lately; a duplicate makes the plain INSERT fail, and the claim is
	// redone with ON CONFLICT DO NOTHING.
	expectNew := c.conflictCooldown.Load() <= 0
	tx, claimed, err := c.pipelinedBeginClaim(ctx, bs, ids, expectNew)
	if err != nil && expectNew && pgsql.IsUniqueViolation(err) {
		c.conflictCooldown.Store(conflictCooldown)
		tx, claimed, err = c.pipelinedBeginClaim(ctx, bs, ids, false)
	}
	if err != nil {
		return nil, nil, err
	}
	if !expectNew && len(claimed) < len(ids) {
		c.conflictCooldown.Store(conflictCooldown)
	} else if !expectNew {
		c.conflictCooldown.Add(-1)
	}
	return withUUIDCodec(tx), claimed, nil
}

// withUUIDCodec registers RegisterUUID's codec on tx's connection (once per
// connection), so a handler binding msg.ID to a uuid parameter pays no text
// round trip.
func withUUIDCodec(tx pgx.Tx) pgx.Tx {
	if conn := tx.Conn(); conn != nil {
		pgsql.RegisterUUID(conn.TypeMap())
	}
	return tx
}

// conflictCooldown is how many transactions claim with ON CONFLICT after a
// duplicate was seen, before trying plain INSERTs again.
const conflictCooldown = 64

func (c *Consumer) pipelinedBeginClaim(ctx context.Context, bs batchSender, ids []uuid.UUID, expectNew bool) (pgx.Tx, map[uuid.UUID]bool, error) {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	read := c.store.queueClaims(b, c.cfg.Name, ids, expectNew)
	br := bs.SendBatch(ctx, b)
	tx := br.Tx()
	_, err := br.Exec() // BEGIN
	var claimed map[uuid.UUID]bool
	if err == nil {
		claimed, err = read(br)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if tx != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
		return nil, nil, fmt.Errorf("inbox: begin and claim: %w", err)
	}
	if tx == nil {
		return nil, nil, errors.New("inbox: begin and claim: no transaction")
	}
	return tx, claimed, nil
}
