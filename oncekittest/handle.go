package oncekittest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/tracecontext"
)

// Outcome is what Handle did with a message.
type Outcome string

// The outcomes of Handle.
const (
	// Processed: the handler succeeded; its writes and the claim committed.
	Processed Outcome = "processed"
	// Duplicate: the message was claimed before; the handler did not run.
	Duplicate Outcome = "duplicate"
	// RolledBack: the handler failed; nothing it wrote, nor the claim,
	// committed. Handle returns the handler's error with it.
	RolledBack Outcome = "rolled_back"
)

// Handle runs h on msg as an inbox.Consumer named consumer does, without a
// broker (rivertest.Worker is the model): in a transaction on db, it claims
// msg.ID in processed_messages, hands the handler the transaction (whose
// Commit and Rollback fail with inbox.ErrTxOwned) and a context holding the
// message's trace context, and commits both only when the handler
// succeeds. A second call with the same message is a Duplicate. msg.Attempt
// defaults to 1. Errors of the database fail tb; the handler's error is
// returned.
func Handle(ctx context.Context, tb testing.TB, db *DB, consumer string, h inbox.Handler, msg broker.Message) (Outcome, error) {
	tb.Helper()
	store, err := inbox.NewStore(db.Schema)
	if err != nil {
		tb.Fatalf("oncekittest: Handle: %v", err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		tb.Fatalf("oncekittest: Handle: begin: %v", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	first, err := store.Claim(ctx, tx, consumer, msg.ID)
	if err != nil {
		tb.Fatalf("oncekittest: Handle: claim %s: %v", msg.ID, err)
	}
	if !first {
		return Duplicate, nil
	}
	m := &inbox.Message{Message: msg, Attempt: 1}
	if herr := h.Handle(tracecontext.W3C{}.Extract(ctx, msg.Headers), ownedTx{tx}, m); herr != nil {
		return RolledBack, herr
	}
	if err := tx.Commit(ctx); err != nil {
		tb.Fatalf("oncekittest: Handle: commit: %v", err)
	}
	return Processed, nil
}

// ownedTx is the handler's view of the transaction: ending it is Handle's
// business, as it is the consumer's.
type ownedTx struct{ pgx.Tx }

func (ownedTx) Commit(context.Context) error   { return inbox.ErrTxOwned }
func (ownedTx) Rollback(context.Context) error { return inbox.ErrTxOwned }
