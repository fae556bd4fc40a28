package inbox

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/pguuid"
)

// The handle stage of a batch: each message is admitted to run or decided
// without its handler (a duplicate, a held-back key, a dead letter), each
// admitted message's handler runs in the batch's transaction (alone, among
// others, or under a savepoint of its own), and a failure is turned into
// the message's outcome. A failure that leaves the transaction unable to
// commit (any, without savepoints; the message's own, alone) ends it here,
// with a rollback; the commit stage ends it otherwise.

// runMessages admits and runs r's messages, in order, and sets their
// outcomes. ended reports that the transaction is over without a commit:
// rolled back at a message's failure (alone, or plain: rolledBack is the
// message whose failure it was), or failed (err; runTx rolls it back).
func (c *Consumer) runMessages(ctx context.Context, mode runMode, r *txRun) (rolledBack int, ended bool, err error) {
	useUUIDCodec(r.tx)
	rolledBack = -1
	for i := range r.items {
		if !c.admit(r, i) {
			continue
		}
		if rolledBack, ended, err = c.runMessage(ctx, mode, r, i); ended {
			break
		}
	}
	if !ended && mode == plain && r.q.flush(ctx) != nil {
		// A statement queued by some message failed at the end.
		ended = true
	}
	if !ended || err != nil {
		return rolledBack, ended, err
	}
	_ = r.tx.Rollback(context.WithoutCancel(ctx))
	r.rolledBack = true
	if r.q.failed >= 0 {
		// A statement queued by a message failed (plain): the failure is
		// that message's, judged once the transaction is rolled back.
		rolledBack = r.q.failed
		r.out[rolledBack] = c.failure(r.tx, r.items[rolledBack], r.q.err)
	}
	return rolledBack, true, nil
}

// useUUIDCodec registers RegisterUUID's codec on tx's connection (once per
// connection), so a handler binding msg.ID to a uuid parameter pays no text
// round trip.
func useUUIDCodec(tx pgx.Tx) {
	if conn := tx.Conn(); conn != nil {
		pguuid.Register(conn.TypeMap())
	}
}

// admit reports whether message i's handler is to run. A message whose
// outcome is already set (a handler failure from a run without savepoints,
// or a copy of it) is not claimed, and the failure is dead-lettered at the
// commit if that is its outcome; an undecodable message is dead-lettered;
// a duplicate, and in ordered mode a message of a held-back key, is decided
// here.
func (c *Consumer) admit(r *txRun, i int) bool {
	it := r.items[i]
	switch o := r.out[i]; o.kind {
	case outPending:
	case outRetry: // failed in the run before this one
		if it.msg.Key != "" {
			r.blocked[it.msg.Key] = true
		}
		return false
	default: // failed in the run before this one (outDead), or a copy of it
		return false
	}
	if it.reason != "" {
		r.out[i] = outcome{kind: outDead, reason: it.reason, kindOf: deadKind(it.reason)}
		return false
	}
	id := it.msg.ID
	first := !r.seen[id]
	r.seen[id] = true
	if r.claimed != nil && (!r.claimed[id] || !first) {
		r.out[i] = outcome{kind: outDuplicate}
		return false
	}
	if c.cfg.Ordered && r.blocked[it.msg.Key] && it.msg.Key != "" {
		r.out[i] = outcome{kind: outSkip}
		r.release = append(r.release, id)
		return false
	}
	return true
}

// deadKind is the metric label of a message dead-lettered before its
// handler ran, by its reason.
func deadKind(reason string) string {
	switch {
	case reason == ReasonNoID:
		return "no_id"
	case strings.HasPrefix(reason, reasonUnauthenticated):
		return "unauthenticated"
	}
	return "invalid_id"
}

// runMessage runs message i of r's transaction and sets its outcome, but
// for a statement queued in a run without savepoints, whose failure is
// judged by runMessages. ended reports that the transaction cannot commit:
// runMessages rolls it back at this message's failure (alone; plain:
// rolledBack), or it failed (err).
func (c *Consumer) runMessage(ctx context.Context, mode runMode, r *txRun, i int) (rolledBack int, ended bool, err error) {
	it := r.items[i]
	herr := c.call(ctx, r.q.on(r.tx, i, mode == savepoints), it.msg)
	switch {
	case mode == plain && r.q.failed >= 0:
		// A statement queued by this message or an earlier one failed
		// when this handler sent one of its own.
		return -1, true, nil
	case mode != plain && herr == nil:
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
		return i, true, nil
	case alone:
		// Its dead letter, if that is its outcome, is written on its own,
		// without the rolled-back claim, by the commit stage.
		return -1, true, nil
	}
	if !r.q.undo(ctx) {
		return -1, true, fmt.Errorf("inbox: cannot roll back to the message's savepoint: %w", herr)
	}
	if r.claimed != nil {
		r.release = append(r.release, it.msg.ID)
	}
	if r.out[i].kind != outDead && it.msg.Key != "" {
		// A dead letter is written at the commit; a retry holds its key
		// back.
		r.blocked[it.msg.Key] = true
	}
	return -1, false, nil
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
