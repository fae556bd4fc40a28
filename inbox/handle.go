package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The handle stage of a batch: each admitted message's handler runs in the
// batch's transaction (alone, among others, or under a savepoint of its
// own), and a failure is turned into the message's outcome.

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

// queueFailed rolls back a batch run without savepoints whose queued
// statement failed, gives the failure to the message that queued it, and
// returns that message's index.
func (c *Consumer) queueFailed(ctx context.Context, r *txRun) int {
	r.rollback(ctx)
	r.out[r.q.failed] = c.failure(r.tx, r.items[r.q.failed], r.q.err)
	return r.q.failed
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
