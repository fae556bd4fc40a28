package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/pgsql"
)

// The claim stage of a batch: its transaction begins and claims its
// messages, in one round trip when the database can pipeline.

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
	// rolledBack: the handle stage rolled the transaction back at a
	// message's failure.
	rolledBack bool
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
		tx: tx, q: newQueueTx(), items: items, out: out, claimed: claimed,
		seen: make(map[uuid.UUID]bool, len(items)), blocked: blocked,
	}, nil
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
	if bs, pipelined := c.db.(batchSender); pipelined && !c.cfg.Test.DisableClaim && len(ids) > 0 {
		// Expect new messages (a plain INSERT) unless a duplicate was seen
		// lately; a duplicate makes the plain INSERT fail, and the claim is
		// redone with ON CONFLICT DO NOTHING.
		expectNew := c.conflictCooldown.Load() <= 0
		var (
			tx      pgx.Tx
			claimed map[uuid.UUID]bool
			err     error
		)
		for plain := expectNew; ; plain = false {
			tx, claimed, err = c.pipelinedBeginClaim(ctx, bs, ids, plain)
			if err == nil || !plain || !pgsql.IsUniqueViolation(err) {
				break
			}
			c.conflictCooldown.Store(conflictCooldown)
		}
		if err != nil {
			return nil, nil, err
		}
		if !expectNew && len(claimed) < len(ids) {
			c.conflictCooldown.Store(conflictCooldown)
		} else if !expectNew {
			c.conflictCooldown.Add(-1)
		}
		return tx, claimed, nil
	}
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
		b := &pgx.Batch{}
		read := c.store.queueClaims(b, c.cfg.Name, ids, false)
		br := tx.SendBatch(ctx, b)
		claimed, err = read(br)
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, nil, err
	}
	return tx, claimed, nil
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
