package inbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	outDropped // dead, but PostgreSQL refused even a minimal dead letter: terminated at the broker
)

type outcome struct {
	kind   outcomeKind
	reason string // outDead
	kindOf string // outDead metric label
	err    error  // outRetry
}

// process runs one batch (often of one) in one transaction and settles every
// message with the broker. In ordered mode it returns, in order, the
// messages to retry in place instead of asking for redelivery.
func (c *Consumer) process(ctx context.Context, items []*item) []*item {
	retry, _ := c.processOut(ctx, items)
	return retry
}

// processOut is process that also returns each message's outcome.
func (c *Consumer) processOut(ctx context.Context, items []*item) ([]*item, []outcome) {
	c.m.batchSize.Observe(float64(len(items)))
	c.verify(items)
	for _, it := range items {
		if it.msg != nil {
			it.msg.Attempt = it.attempt
		}
	}
	out := make([]outcome, len(items))
	if err := c.runBatch(ctx, items, out); err != nil {
		keep := c.keepDuplicates(ctx)
		for i := range out {
			if out[i].kind != outDuplicate || !keep {
				out[i] = outcome{kind: outRetry, err: err}
			}
		}
	}
	return c.settle(ctx, items, out), out
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
		_, err := c.runTx(ctx, alone, items, out, nil)
		return err
	}
	if c.failureCooldown.Load() > 0 {
		c.failureCooldown.Add(-1)
	} else {
		failed, err := c.runTx(ctx, plain, items, out, nil)
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
		return c.runIsolated(ctx, items, out, nil)
	}
	// In parts of at most maxSavepoints, each its own transaction; in
	// ordered mode a key held back by a part holds the later parts too.
	blocked := map[string]bool{}
	for lo := 0; lo < len(items); lo += maxSavepoints {
		part, pout := items[lo:min(lo+maxSavepoints, len(items))], out[lo:min(lo+maxSavepoints, len(items))]
		if err := c.runIsolated(ctx, part, pout, blocked); err != nil {
			keep := c.keepDuplicates(ctx)
			for i := range pout {
				if pout[i].kind != outDuplicate || !keep {
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

// runMode is how the messages of one transaction run: the three ways of
// runBatch.
type runMode int

const (
	// alone: a single message in its transaction; its failure ends the
	// transaction, and its dead letter, if that is the outcome, is written
	// on its own (without the claim).
	alone runMode = iota
	// plain: several messages without savepoints; the first failure (of a
	// handler, or of a statement one queued) rolls the transaction back.
	plain
	// savepoints: several messages, each under a savepoint of its own, so
	// that a failure undoes only itself.
	savepoints
)

// runTx runs items in one transaction, one way: the claim stage (beginTx:
// the transaction and the claims, one round trip; admit), the run of each
// admitted message (runMessage), and the settle stage (commitTx: releases,
// dead letters, COMMIT). It fills out and returns the index of the message
// whose failure rolled the whole transaction back (-1: none; only plain
// does), and an error when the transaction as a whole failed. In ordered
// mode a key in blocked (nil: none) waits behind an earlier failure.
func (c *Consumer) runTx(ctx context.Context, mode runMode, items []*item, out []outcome, blocked map[string]bool) (rolledBack int, err error) {
	r, err := c.beginTx(ctx, items, out, blocked)
	if err != nil {
		c.watch.Failed("claim", err)
		return -1, err
	}
	c.watch.OK("claim")
	defer r.rollbackOn(ctx, &err)
	for i := range items {
		if !c.admit(r, i) {
			continue
		}
		if rolledBack, ended, err := c.runMessage(ctx, mode, r, i); ended {
			return rolledBack, err
		}
	}
	if mode == plain && r.q.flush(ctx) != nil {
		// A statement queued by some message failed at the end.
		return c.queueFailed(ctx, r), nil
	}
	if err := c.commitTx(ctx, r); err != nil {
		c.watch.Failed("commit", err)
		return -1, err
	}
	c.watch.OK("commit")
	return -1, nil
}

// runMessage runs message i of r's transaction and sets its outcome. ended
// reports that the transaction is over without a commit: rolled back at
// this message's failure (rolledBack, plain), given up on (alone), or
// failed (err).
func (c *Consumer) runMessage(ctx context.Context, mode runMode, r *txRun, i int) (rolledBack int, ended bool, err error) {
	it := r.items[i]
	var sp *savepointTx
	on := pgx.Tx(r.tx)
	if mode == savepoints {
		sp = newSavepointTx(r.tx)
		on = sp
	}
	herr := c.call(ctx, r.q.on(on, i), it.msg)
	if mode == plain {
		if r.q.failed >= 0 {
			// A statement queued by this message or an earlier one failed
			// when this handler sent one of its own.
			return c.queueFailed(ctx, r), true, nil
		}
	} else if herr == nil {
		// What the message queued goes now, alone or under its savepoint.
		herr = r.q.flush(ctx)
	}
	if mode != plain {
		r.q.reset()
	}
	if herr == nil {
		r.out[i] = outcome{kind: outProcessed}
		return -1, false, nil
	}
	r.out[i] = c.failure(r.tx, it, herr)
	switch mode {
	case plain:
		r.rollback(ctx)
		return i, true, nil
	case alone:
		r.rollback(ctx)
		if r.out[i].kind == outDead {
			recorded, derr := c.recordDead(ctx, c.db, it, c.deadLetter(it, r.out[i].reason))
			switch {
			case derr != nil:
				c.watch.Failed("dead_letter", derr)
				r.out[i] = outcome{kind: outRetry, err: errors.Join(herr, derr)}
			case !recorded:
				r.out[i].kind = outDropped
			default:
				c.watch.OK("dead_letter")
			}
		}
		return -1, true, nil
	}
	if !sp.undo(ctx) {
		return -1, true, fmt.Errorf("inbox: cannot roll back to the message's savepoint: %w", herr)
	}
	if r.claimed != nil {
		r.release = append(r.release, it.msg.ID)
	}
	if r.out[i].kind == outDead {
		r.dead = append(r.dead, pendingDead{i, c.deadLetter(it, r.out[i].reason)})
	} else if it.msg.Key != "" {
		r.blocked[it.msg.Key] = true
	}
	return -1, false, nil
}

// runIsolated runs a batch in which a handler failure undoes only itself:
// alone for one message, with savepoints for more.
func (c *Consumer) runIsolated(ctx context.Context, items []*item, out []outcome, blocked map[string]bool) error {
	mode := savepoints
	if len(items) == 1 {
		mode = alone
	}
	_, err := c.runTx(ctx, mode, items, out, blocked)
	return err
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

// failure decides what a handler error in tx means for it: dead letter or
// retry. A transient failure (PostgreSQL's, not the message's) is retried
// however many attempts the message has had, except on the source's last
// delivery (MaxDeliver), after which the broker would drop it: a dead
// letter keeps it.
func (c *Consumer) failure(tx pgx.Tx, it *item, err error) outcome {
	switch {
	case IsPermanent(err):
		return outcome{kind: outDead, reason: err.Error(), kindOf: "permanent", err: err}
	case transient(tx, err) && !c.lastDelivery(it):
		return outcome{kind: outRetry, err: err}
	case it.attempt >= c.cfg.MaxAttempts:
		return outcome{kind: outDead, reason: reasonMaxAttempts + err.Error(), kindOf: "max_attempts", err: err}
	default:
		return outcome{kind: outRetry, err: err}
	}
}

// lastDelivery reports whether the broker will not deliver it again.
func (c *Consumer) lastDelivery(it *item) bool {
	n := c.maxDeliver.Load()
	return n > 0 && int64(it.attempt) >= n
}

func deadKind(reason string) string {
	switch {
	case reason == ReasonNoID:
		return "no_id"
	case strings.HasPrefix(reason, reasonUnauthenticated):
		return "unauthenticated"
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

// keepDuplicates reports whether the messages a failed transaction found
// already claimed may still be acked. Not with synchronous standbys: the
// claim may be visible here and not yet on the standby, and only a
// transaction that commits (with its barrier, see commitTx) proves it is
// there; they are retried instead, and found claimed again.
func (c *Consumer) keepDuplicates(ctx context.Context) bool {
	return !c.syncStandbys.On(ctx, c.db)
}
