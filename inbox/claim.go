package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/pguuid"
)

// The claim stage of a batch: its transaction begins and claims its
// messages (one round trip), and each message is admitted to run or decided
// without its handler (a duplicate, a held-back key, a dead letter).

// txRun is one transaction of a batch under way: the claims it took and what
// it has to write before its commit.
type txRun struct {
	tx      pgx.Tx
	q       *queueTx
	items   []*item
	out     []outcome
	claimed map[uuid.UUID]bool // nil when claims are off
	seen    map[uuid.UUID]bool
	blocked map[string]bool // ordered: keys held back by an earlier failure
	release []uuid.UUID     // claims to give back (held back, or failed under a savepoint)
	dead    []pendingDead
}

// pendingDead is a dead letter to write before the commit, for message i.
type pendingDead struct {
	i  int
	dl DeadLetter
}

// beginTx begins the transaction of items and claims their pending messages.
// In ordered mode the messages whose key is in blocked (nil: none) wait
// behind an earlier failure.
func (c *Consumer) beginTx(ctx context.Context, items []*item, out []outcome, blocked map[string]bool) (*txRun, error) {
	tx, claimed, err := c.beginClaim(ctx, items, out)
	if err != nil {
		return nil, err
	}
	if blocked == nil {
		blocked = map[string]bool{}
	}
	return &txRun{
		tx: tx, q: newQueueTx(tx), items: items, out: out, claimed: claimed,
		seen: make(map[uuid.UUID]bool, len(items)), blocked: blocked,
	}, nil
}

// rollback ends the transaction whatever ctx says.
func (r *txRun) rollback(ctx context.Context) {
	_ = r.tx.Rollback(context.WithoutCancel(ctx))
}

// rollbackOn rolls the transaction back when *err is set: a mode's deferred
// call, for the errors that leave its transaction open.
func (r *txRun) rollbackOn(ctx context.Context, err *error) {
	if *err != nil {
		r.rollback(ctx)
	}
}

// admit reports whether message i's handler is to run. A message whose
// outcome is already set (a handler failure from a run without savepoints,
// or a copy of it) is not claimed, and the failure is dead-lettered in this
// transaction if that is its outcome; an undecodable message is
// dead-lettered; a duplicate, and in ordered mode a message of a held-back
// key, is decided here.
func (c *Consumer) admit(r *txRun, i int) bool {
	it := r.items[i]
	switch o := r.out[i]; o.kind {
	case outPending:
	case outDead: // failed in the run before this one
		r.dead = append(r.dead, pendingDead{i, c.deadLetter(it, o.reason)})
		return false
	case outRetry: // failed in the run before this one
		if it.msg.Key != "" {
			r.blocked[it.msg.Key] = true
		}
		return false
	default: // a copy of the message that failed in the run before
		return false
	}
	if it.reason != "" {
		r.out[i] = outcome{kind: outDead, reason: it.reason, kindOf: deadKind(it.reason)}
		r.dead = append(r.dead, pendingDead{i, c.deadLetter(it, it.reason)})
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
	if c.cfg.Test.DisableClaim || len(ids) == 0 || !pipelined {
		tx, err := c.db.Begin(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("inbox: begin: %w", err)
		}
		var claimed map[uuid.UUID]bool
		switch {
		case c.cfg.Test.DisableClaim:
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
		pguuid.Register(conn.TypeMap())
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
