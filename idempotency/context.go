package idempotency

import (
	"context"
	"errors"
	"net/http"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"
)

// Info describes the idempotent execution a handler runs in.
type Info struct {
	Tenant    string // the scope the route's Tenant extractor returned
	Operation string // the route's Operation
	Key       string // the client's Idempotency-Key, parsed
	// Token is the claim's fencing token: 1 for a first execution, higher
	// after each recovery or reuse of an expired key.
	Token int64
	// Recovered is true when this execution took over a claim whose previous
	// owner died mid-handler (Separate mode). The previous run may have done
	// some of the work: derive IDs with ID and write with ON CONFLICT DO
	// NOTHING, and route external calls through the side-effect ledger.
	Recovered bool
}

// ID returns oncekit.DeriveID(Tenant, Key): the deterministic ID of the
// operation the client started with this key, equal on every retry. Use it
// as the primary key of the row the request creates, and derive event IDs
// from it, so that a re-execution writes the same IDs and dedups at every
// later layer.
func (i Info) ID() uuid.UUID { return oncekit.DeriveID(i.Tenant, i.Key) }

type infoKey struct{}
type txKey struct{}

// FromRequest returns the idempotent execution the request's handler runs
// in; ok is false outside the middleware (or on an optional route without a
// key).
func FromRequest(r *http.Request) (Info, bool) {
	i, ok := r.Context().Value(infoKey{}).(Info)
	return i, ok
}

// Tx returns the claim's transaction in a SameTx route. The handler writes its
// rows and outbox events in it; the middleware stores the response and
// commits (or rolls back when the response is not stored). The handler must
// not commit or roll it back itself: those calls return ErrTxOwned.
//
// The middleware signature (func(http.Handler) http.Handler) leaves the
// request as the only channel to the handler, which is why the transaction
// travels in the request's context here and nowhere else in oncekit.
// Code that writes through database/sql (sqlc, GORM, Bun, ent) gets the
// transaction as a *sql.Tx from oncekit.WithSQLTx.
func Tx(r *http.Request) (pgx.Tx, bool) {
	tx, ok := r.Context().Value(txKey{}).(pgx.Tx)
	return tx, ok
}

// ErrTxOwned is returned when a handler commits or rolls back the
// transaction the middleware owns.
var ErrTxOwned = errors.New("idempotency: the transaction belongs to the middleware; it commits with the stored response")

// ownedTx hands the claim's transaction to the handler without letting it end
// the transaction.
type ownedTx struct{ pgx.Tx }

func (ownedTx) Commit(context.Context) error   { return ErrTxOwned }
func (ownedTx) Rollback(context.Context) error { return ErrTxOwned }

func withInfo(ctx context.Context, i Info) context.Context {
	return context.WithValue(ctx, infoKey{}, i)
}
