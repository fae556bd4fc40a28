package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/crashpoint"
	"github.com/oncekit/oncekit/internal/pgsql"
)

// The commit stage of a transaction: what its messages' outcomes leave to
// write (the claims given back, the dead letters) is written, and the
// transaction commits. It is also where a message run alone, whose failure
// rolled its transaction back, has its dead letter written on its own.

// commitTx ends r's transaction once the handle stage has set every
// outcome. It gives back the claims of messages held back or undone, writes
// the dead letters and commits; an error means the transaction failed
// (runTx rolls it back). When the commit's outcome is unknown it returns
// that as unknown, with a nil error: the messages are to be left to
// redelivery (outUnknown).
//
// When the handle stage rolled back the transaction of a message run alone
// (r.rolledBack), only that message's dead letter, if that is its
// outcome, is written, on its own and without the claim; a failure to
// write it makes the message a retry.
func (c *Consumer) commitTx(ctx context.Context, r *txRun) (unknown, err error) {
	var q oncekit.Querier = r.tx
	switch {
	case r.rolledBack:
		q = c.db
	case r.claimed != nil && len(r.release) > 0:
		if err := c.store.unclaimAll(ctx, r.tx, c.cfg.Name, r.release); err != nil {
			return nil, err
		}
	}
	derr := c.recordDead(ctx, q, r.items, r.out)
	if r.rolledBack {
		// A message run alone: a dead letter that could not be written
		// makes it a retry.
		switch o := &r.out[0]; {
		case derr != nil:
			c.watch.Failed("dead_letter", derr)
			*o = outcome{kind: outRetry, err: errors.Join(o.err, derr)}
		case o.kind == outDead: // recorded, not dropped
			c.watch.OK("dead_letter")
		}
		return nil, nil
	}
	if derr != nil {
		return nil, derr
	}
	if slices.ContainsFunc(r.out, isDuplicate) && c.syncStandbys.On(ctx, r.tx) {
		// A claim found already there may be one whose commit is visible
		// on this primary and not yet on its synchronous standby (a
		// cancelled wait): acking its message as done must wait until
		// the standby has it, or a failover erases a claim whose message
		// nothing redelivers. The barrier makes this commit wait for it.
		if _, err := r.tx.Exec(ctx, pgsql.SyncBarrierSQL); err != nil {
			return nil, fmt.Errorf("inbox: wait for the synchronous standby: %w", err)
		}
	}
	crashpoint.Hit(crashpoint.InboxBeforeCommit)
	if err := r.tx.Commit(ctx); err != nil {
		if definiteRollback(err) {
			return nil, fmt.Errorf("inbox: commit: %w", err)
		}
		c.log.Error("inbox commit outcome unknown; leaving the messages to redelivery", "err", err, "messages", len(r.items))
		return err, nil
	}
	crashpoint.Hit(crashpoint.InboxAfterCommit)
	return nil, nil
}

// isDuplicate reports whether o is of a message found already claimed.
func isDuplicate(o outcome) bool { return o.kind == outDuplicate }

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
