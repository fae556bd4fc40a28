package inbox

import "context"

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
	term   string // outDropped: reason as the broker's termination carries it
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
		c.redoAll(ctx, out, outRetry, err)
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
		_, err := c.runTx(ctx, isolated(len(items)), items, out, nil)
		return err
	}
	// In parts of at most maxSavepoints, each its own transaction; in
	// ordered mode a key held back by a part holds the later parts too.
	blocked := map[string]bool{}
	for lo := 0; lo < len(items); lo += maxSavepoints {
		part, pout := items[lo:min(lo+maxSavepoints, len(items))], out[lo:min(lo+maxSavepoints, len(items))]
		if _, err := c.runTx(ctx, isolated(len(part)), part, pout, blocked); err != nil {
			c.redoAll(ctx, pout, outRetry, err)
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

// runTx runs items in one transaction, one way, through the stages of a
// transaction, each in its file, called once, none calling back here: the
// claim stage (claim.go; beginTx: the transaction and the claims, one round
// trip), the handle stage (handle.go; runMessages: each message admitted
// and its handler run) and the commit stage (commit.go; commitTx: releases,
// dead letters, COMMIT, or the dead letter of a message run alone after its
// rollback). What their answers call for is done here: the rollback of a
// transaction an error left open, and a new attempt at every message after
// a commit whose outcome is unknown. runTx fills out and returns the index
// of the message whose failure rolled the whole transaction back (-1:
// none; only plain does), and an error when the transaction as a whole
// failed. In ordered mode a key in blocked (nil: none) waits behind an
// earlier failure.
func (c *Consumer) runTx(ctx context.Context, mode runMode, items []*item, out []outcome, blocked map[string]bool) (rolledBack int, err error) {
	r, err := c.beginTx(ctx, items, out, blocked)
	if err != nil {
		c.watch.Failed("claim", err)
		return -1, err
	}
	c.watch.OK("claim")
	defer r.rollbackOn(ctx, &err)
	rolledBack, ended, err := c.runMessages(ctx, mode, r)
	if err != nil || ended && mode == plain {
		return rolledBack, err
	}
	unknown, err := c.commitTx(ctx, r)
	if ended {
		return -1, nil // alone, rolled back at its failure: its dead letter written on its own
	}
	if err != nil {
		c.watch.Failed("commit", err)
		return -1, err
	}
	if unknown != nil {
		c.redoAll(ctx, out, outUnknown, unknown)
	}
	c.watch.OK("commit")
	return -1, nil
}

// rollbackOn rolls r's transaction back, whatever ctx says, when *err is
// set: runTx's deferred call, for the errors that leave it open.
func (r *txRun) rollbackOn(ctx context.Context, err *error) {
	if *err != nil {
		_ = r.tx.Rollback(context.WithoutCancel(ctx))
	}
}

// isolated is the mode of a run in which a handler failure undoes only
// itself: alone for one message, with savepoints for more.
func isolated(n int) runMode {
	if n == 1 {
		return alone
	}
	return savepoints
}

// redoAll leaves every message of out to a new attempt, with outcome kind
// (outRetry after a failed transaction, outUnknown after a commit whose
// outcome is unknown) and err, except the messages found already claimed
// while they may still be acked. Not with synchronous standbys: the claim
// may be visible here and not yet on the standby, and only a transaction
// that commits (with its barrier, see commitTx) proves it is there; they are
// retried instead, and found claimed again.
func (c *Consumer) redoAll(ctx context.Context, out []outcome, kind outcomeKind, err error) {
	keep := !c.syncStandbys.On(ctx, c.db)
	for i := range out {
		if out[i].kind != outDuplicate || !keep {
			out[i] = outcome{kind: kind, err: err}
		}
	}
}
