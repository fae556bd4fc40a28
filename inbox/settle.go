package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/crashpoint"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/untrusted"
)

// The settle stage of a batch: its transaction ends (releases, dead
// letters, COMMIT), and each message is acked, naked or handed back to the
// broker according to its outcome.

// commitTx gives back the claims of messages held back or undone, writes the
// dead letters and commits. When the commit's outcome is unknown the
// messages are left to redelivery (outUnknown) and commitTx returns nil; an
// error means the transaction failed and was rolled back.
func (c *Consumer) commitTx(ctx context.Context, r *txRun) error {
	if r.claimed != nil && len(r.release) > 0 {
		if err := c.store.unclaimAll(ctx, r.tx, c.cfg.Name, r.release); err != nil {
			return err
		}
	}
	if err := c.recordDead(ctx, r.tx, r.items, r.out); err != nil {
		return err
	}
	if slices.ContainsFunc(r.out, isDuplicate) && c.syncStandbys.On(ctx, r.tx) {
		// A claim found already there may be one whose commit is visible
		// on this primary and not yet on its synchronous standby (a
		// cancelled wait): acking its message as done must wait until
		// the standby has it, or a failover erases a claim whose message
		// nothing redelivers. The barrier makes this commit wait for it.
		if _, err := r.tx.Exec(ctx, pgsql.SyncBarrierSQL); err != nil {
			return fmt.Errorf("inbox: wait for the synchronous standby: %w", err)
		}
	}
	crashpoint.Hit(crashpoint.InboxBeforeCommit)
	if err := r.tx.Commit(ctx); err != nil {
		if definiteRollback(err) {
			return fmt.Errorf("inbox: commit: %w", err)
		}
		c.log.Error("inbox commit outcome unknown; leaving the messages to redelivery", "err", err, "messages", len(r.items))
		c.redoAll(ctx, r.out, outUnknown, err)
		return nil
	}
	crashpoint.Hit(crashpoint.InboxAfterCommit)
	return nil
}

// settle acks, naks or returns each message according to its outcome.
func (c *Consumer) settle(ctx context.Context, items []*item, out []outcome) []*item {
	done := settled(items, out, c.cfg.Ordered)
	c.inHand.release(done)
	if c.gate != nil {
		for _, it := range done {
			c.gate.settled(it)
		}
	}
	var processed, dups int
	var retry []*item
	for i, it := range items {
		o := out[i]
		switch o.kind {
		case outProcessed:
			processed++
			c.ack(ctx, it)
		case outDuplicate:
			dups++
			c.ack(ctx, it)
		case outDead:
			c.dead.Add(1)
			c.m.deadLettered.WithLabelValues(o.kindOf).Inc()
			c.logger(it).Warn("inbox message dead-lettered", "reason", o.reason)
			c.ack(ctx, it)
		case outDropped:
			c.terminated.Add(1)
			c.m.terminated.Inc()
			c.term(ctx, it, o.reason)
		case outRetry:
			c.retried.Add(1)
			c.m.retried.Inc()
			delay := c.cfg.backoff(it.attempt)
			if pgsql.Broken(o.err) {
				// A statement that cannot succeed as sent: the watch
				// logs it at error level, once per cause and minute.
				c.logger(it).Debug("inbox message not run; retrying", "err", o.err, "delay", delay)
			} else {
				c.logger(it).Warn("inbox handler failed; retrying", "err", o.err, "delay", delay)
			}
			if c.cfg.Ordered {
				it.failed = true
				retry = append(retry, it)
				continue
			}
			if err := it.d.Nak(ctx, delay); err != nil {
				c.logger(it).Warn("inbox nak failed; the broker redelivers after its ack wait", "err", err)
			}
		case outSkip:
			retry = append(retry, it)
		case outUnknown:
			// Never acked: a new attempt's claim settles it (a duplicate
			// if the commit went through). Ordered mode makes that attempt
			// in place, before the key's next messages; otherwise the
			// broker redelivers after its ack wait.
			if c.cfg.Ordered {
				it.failed = true
				retry = append(retry, it)
			}
		}
	}
	c.m.addProcessed(processed)
	c.m.addDuplicates(dups)
	c.m.updateRatio()
	return retry
}

// settled returns the items settle hands over to the broker: all of them,
// but in ordered mode those it keeps to retry in place.
func settled(items []*item, out []outcome, ordered bool) []*item {
	if !ordered {
		return items
	}
	done := make([]*item, 0, len(items))
	for i, it := range items {
		switch out[i].kind {
		case outRetry, outSkip, outUnknown:
		default:
			done = append(done, it)
		}
	}
	return done
}

// term settles it for good: terminated where the broker can (its
// advisory records reason), acked elsewhere.
func (c *Consumer) term(ctx context.Context, it *item, reason string) {
	t, ok := it.d.(broker.Terminator)
	if !ok {
		c.ack(ctx, it)
		return
	}
	if err := t.Term(ctx, untrusted.Text(reason, 256)); err != nil {
		c.logger(it).Warn("inbox term failed; the broker redelivers the message", "err", err)
	}
}

func (c *Consumer) ack(ctx context.Context, it *item) {
	if err := it.d.Ack(ctx); err != nil && c.log.Enabled(ctx, slog.LevelDebug) {
		// A lost ack means a redelivery, which the claim absorbs.
		c.logger(it).Debug("inbox ack failed", "err", err)
	}
}

// isDuplicate reports whether o is of a message found already claimed.
func isDuplicate(o outcome) bool { return o.kind == outDuplicate }

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
