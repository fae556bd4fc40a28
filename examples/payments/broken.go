package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/sideeffect"
	"github.com/oncekit/oncekit/sideeffect/webhook"
)

// Deliberately broken builds, selected by PAYMENTS_BROKEN, exist only so that
// the chaos checker can be shown to catch what each guarantee prevents. A
// real service never sets it.
const (
	// brokenStoreAfterCommit runs the edge in its separate mode while the
	// handler commits the payment in a transaction of its own: a crash
	// between that commit and the edge's store leaves a payment whose
	// response was never kept, and a retry runs the handler again.
	brokenStoreAfterCommit = "edge-stores-after-commit"
	// brokenKeyOnly guards payments by their Idempotency-Key alone: no
	// business key at the edge and no unique reference in the table, so a
	// client that sends a payment again under a new key makes a second one.
	brokenKeyOnly = "key-only-edge"
	// brokenMarkBeforeAck has the relay mark rows published before
	// JetStream acknowledged them: a crash in between loses the events.
	brokenMarkBeforeAck = "relay-marks-before-ack"
	// brokenAckBeforeCommit acks each message as its handler starts, before
	// its transaction commits: a crash in between loses the ledger entry.
	brokenAckBeforeCommit = "ack-before-commit"
	// brokenClaimApart claims each message in a transaction of its own,
	// committed before the handler's: a crash in between leaves a claim
	// whose work never committed, and the redelivery is skipped as a
	// duplicate.
	brokenClaimApart = "claim-apart"
	// brokenGateBypassed keeps the ordered consumer's lanes but skips its
	// check of what other processes hold: two consumers apply an account's
	// payments out of order once a redelivery or a second process is
	// involved.
	brokenGateBypassed = "gate-bypassed"
	// brokenCallBeforeFired replaces the dispatcher with one that calls
	// the provider inside its claim's transaction, before the attempt is
	// committed: a crash during the call leaves no record of it, and the
	// next attempt goes out under the same number.
	brokenCallBeforeFired = "call-before-fired"
	// brokenFreshKey sends every provider call with a new idempotency key
	// instead of the effect's derived one: a retried call acts twice.
	brokenFreshKey = "fresh-provider-key"
	// brokenClaimCommitLocal commits the consumer's claim and work with
	// synchronous_commit = local: the commit returns, and the message is
	// acked, before the standby has the transaction, so a failover erases
	// a claim whose message nothing will redeliver.
	brokenClaimCommitLocal = "claim-commit-local"
	// brokenPaymentCommitLocal commits the payment and its outbox row with
	// synchronous_commit = local: the row is visible, and published, before
	// the standby has it, so a failover erases a payment whose event is
	// out: a phantom.
	brokenPaymentCommitLocal = "payment-commit-local"
)

// commitLocal makes tx's commit wait for the local disk only, not for the
// synchronous standby: the bug of a service that turned synchronous
// replication off for one transaction to make it faster.
func commitLocal(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `SELECT set_config('synchronous_commit', 'local', true)`)
	return err
}

// crashAt kills the process at the n-th call for the point named by
// ONCEKIT_CRASHPOINT, n from ONCEKIT_CRASHPOINT_AFTER (default 1): the
// chaos run arms the broken builds' own windows the way it arms oncekit's.
func crashAt(point string) {
	if os.Getenv("ONCEKIT_CRASHPOINT") != point {
		return
	}
	n, err := strconv.Atoi(os.Getenv("ONCEKIT_CRASHPOINT_AFTER"))
	if crashHits.Add(1) < int64(n) && err == nil {
		return
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

var crashHits atomic.Int64

// ackInHandler lets the handler ack its message first, before its work
// and the transaction's commit: the bug of a handler that acks early. The
// consumer is the real ordered one otherwise; a process that dies between
// the ack and the commit loses that message, and an ack that moves the
// floor before the commit lets the ordered gate take the message for
// applied.
type ackInHandler struct {
	broker.OrderedSource
	flush    func() error // waits until the ack reached the server
	received sync.Map     // event ID -> broker.Delivery
}

func (s *ackInHandler) Receive(ctx context.Context, max int) ([]broker.Delivery, error) {
	ds, err := s.OrderedSource.Receive(ctx, max)
	for _, d := range ds {
		id := d.Header(broker.HeaderEventID)
		if id == "" {
			id = d.Header(broker.HeaderMsgID)
		}
		s.received.Store(id, d)
	}
	return ds, err
}

// ack acks m's delivery at the broker, from inside the handler.
func (s *ackInHandler) ack(ctx context.Context, m *inbox.Message) {
	if d, ok := s.received.LoadAndDelete(m.ID.String()); ok {
		_ = d.(broker.Delivery).Ack(ctx)
		_ = s.flush()
	}
}

// claimApart claims messages on the pool, each claim committed at once.
type claimApart struct {
	pool  *pgxpool.Pool
	store *inbox.Store
}

func newClaimApart(pool *pgxpool.Pool, schema string) (*claimApart, error) {
	store, err := inbox.NewStore(schema)
	if err != nil {
		return nil, err
	}
	return &claimApart{pool: pool, store: store}, nil
}

// claim commits m's claim and reports whether it is the first.
func (c *claimApart) claim(ctx context.Context, m *inbox.Message) (bool, error) {
	return c.store.Claim(ctx, c.pool, consumerName, m.ID)
}

// freshKey calls the provider with a random key, while still claiming to
// honour keys so that the dispatcher retries indefinite outcomes.
type freshKey struct{ *webhook.Provider }

func (p freshKey) Call(ctx context.Context, c sideeffect.Call) (string, error) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	c.Key = hex.EncodeToString(b[:])
	return p.Provider.Call(ctx, c)
}

// ignoreCancel treats a daemon stopped by its context as a clean exit.
func ignoreCancel(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
