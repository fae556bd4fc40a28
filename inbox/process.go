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

// process runs one batch (often of one) in one transaction and settles every
// message with the broker. In ordered mode it returns, in order, the
// messages to retry in place instead of asking for redelivery.
func (c *Consumer) process(ctx context.Context, items []*item) []*item {
	c.m.batchSize.Observe(float64(len(items)))
	c.verify(items)
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
		return c.runOne(ctx, items, out, nil)
	}
	if c.failureCooldown.Load() > 0 {
		c.failureCooldown.Add(-1)
	} else {
		failed, rolledBack, err := c.runPlain(ctx, items, out)
		if err != nil || !rolledBack {
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
