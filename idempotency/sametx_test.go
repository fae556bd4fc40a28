package idempotency_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// A SameTx claim that times out waiting for another lock than the key's row
// (here a table lock, as a migration takes; under load, the table's
// extension) is no sign of a request in progress: the first request for a
// key must not be answered 409. It claims again, waiting longer, and runs.
func TestSameTxOtherLockIsNotInProgress(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	// The edge's pool has one connection, and a first request prepares its
	// claim there: the table's lock then meets the claim's execution (under
	// its lock_timeout), not its preparation.
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	edge, err := idempotency.New(pool, &idempotency.Config{Schema: db.Schema})
	require.NoError(t, err)
	mw, err := edge.Route(&idempotency.Route{Operation: "create-payment", Mode: idempotency.SameTx, Tenant: tenantFromHeader})
	require.NoError(t, err)
	var runs atomic.Int64
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()
	require.Equal(t, http.StatusCreated, post(t, srv.URL, "acme", "pay-0", `{}`).status)
	table := pgx.Identifier{db.Schema, "idempotency_keys"}.Sanitize()

	locker, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer locker.Rollback(ctx) //nolint:errcheck
	_, err = locker.Exec(ctx, "LOCK TABLE "+table+" IN SHARE MODE")
	require.NoError(t, err)

	answered := make(chan response, 1)
	go func() { answered <- post(t, srv.URL, "acme", "pay-1", `{}`) }()

	// Release the table once a claim has waited for it longer than the
	// route's 1 ms wait: that is the second claim, the patient one.
	waiting := func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks
			WHERE relation = $1::regclass AND NOT granted AND now() - waitstart > interval '50 ms'`, table).Scan(&n))
		return n > 0
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !waiting() {
		select {
		case r := <-answered:
			t.Fatalf("answered %d while the table was locked, before a claim waited for it: %s", r.status, r.body)
		case <-tick.C:
		}
	}
	require.NoError(t, locker.Commit(ctx))

	r := <-answered
	require.Equal(t, http.StatusCreated, r.status, r.body)
	require.EqualValues(t, 2, runs.Load())
}

// A SameTx claim whose statement is cancelled though its request was not
// (an operator's pg_cancel_backend; PostgreSQL's own report of a lock
// timeout that fired as the lock was granted) did not run: the request
// goes on waiting as its route says, claims once the lock is free, and
// runs. It is no store failure (503).
func TestSameTxCancelledClaimWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	edge, err := idempotency.New(db.Pool, &idempotency.Config{Schema: db.Schema})
	require.NoError(t, err)
	mw, err := edge.Route(&idempotency.Route{Operation: "create-payment", Mode: idempotency.SameTx, Tenant: tenantFromHeader, Waiting: &idempotency.Waiting{For: 10 * time.Second}})
	require.NoError(t, err)
	var runs atomic.Int64
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()
	require.Equal(t, http.StatusCreated, post(t, srv.URL, "acme", "pay-0", `{}`).status)
	table := pgx.Identifier{db.Schema, "idempotency_keys"}.Sanitize()

	locker, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer locker.Rollback(ctx) //nolint:errcheck
	_, err = locker.Exec(ctx, "LOCK TABLE "+table+" IN SHARE MODE")
	require.NoError(t, err)

	answered := make(chan response, 1)
	go func() { answered <- post(t, srv.URL, "acme", "pay-1", `{}`) }()

	// Cancel the claim once it has waited for the table longer than the
	// route's 1 ms: the patient claim, whose lock timeout is a second.
	cancelled := func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(pg_cancel_backend(pid)) FROM pg_locks
			WHERE relation = $1::regclass AND NOT granted AND now() - waitstart > interval '50 ms'`, table).Scan(&n))
		return n > 0
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cancelled() {
		select {
		case r := <-answered:
			t.Fatalf("answered %d while the table was locked, before its claim was cancelled: %s", r.status, r.body)
		case <-tick.C:
		}
	}
	require.NoError(t, locker.Commit(ctx))

	r := <-answered
	require.Equal(t, http.StatusCreated, r.status, r.body)
	require.EqualValues(t, 2, runs.Load())
}
