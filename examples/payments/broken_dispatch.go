package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/sideeffect"
)

// crashCalledNotRecorded is the crash point of the call-before-fired build:
// the provider was called, the attempt is not committed.
const crashCalledNotRecorded = "payments.called-not-recorded"

// callInTx is the dispatcher a service might write by hand in place of
// sideeffect.Dispatcher: it locks a due effect, calls the provider, and
// records the attempt with its outcome, all in one transaction that commits
// after the call. Nothing records the call before it is made: a crash during
// it leaves the row as it was, and the next attempt goes out under the same
// number. (With the same key: the provider does not act twice; what broke is
// the ledger's record of every call made.)
type callInTx struct {
	pool      *pgxpool.Pool
	table     string
	providers map[string]sideeffect.Provider
	workers   int
}

// Run calls due effects on workers goroutines until ctx ends.
func (d *callInTx) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for range d.workers {
		wg.Go(func() {
			idle := time.NewTicker(50 * time.Millisecond)
			defer idle.Stop()
			for ctx.Err() == nil {
				if called, err := d.callOne(ctx); err != nil || !called {
					select { // nothing due, or a failure: look again in a moment
					case <-ctx.Done():
					case <-idle.C:
					}
				}
			}
		})
	}
	wg.Wait()
	return nil
}

// callOne calls one due effect, if there is one, and commits its attempt.
func (d *callInTx) callOne(ctx context.Context) (called bool, err error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var c sideeffect.Call
	err = tx.QueryRow(ctx, `SELECT id, idempotency_key, kind, source_id, payload, attempts + 1, created_at FROM `+d.table+`
		WHERE state = 'pending' AND next_attempt_at <= now() ORDER BY next_attempt_at LIMIT 1 FOR UPDATE SKIP LOCKED`).
		Scan(&c.ID, &c.Key, &c.Kind, &c.SourceID, &c.Payload, &c.Attempt, &c.RecordedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	p, ok := d.providers[c.Kind]
	if !ok {
		return false, fmt.Errorf("no provider for effects of kind %q", c.Kind)
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	ref, callErr := p.Call(cctx, c)
	cancel()
	crashAt(crashCalledNotRecorded)
	if errors.Is(callErr, sideeffect.ErrDuplicate) {
		callErr = nil // acted on an earlier call: a replay
	}
	if callErr != nil {
		_, err = tx.Exec(ctx, `UPDATE `+d.table+` SET attempts = $2, fired_at = now(),
			next_attempt_at = now() + interval '200 milliseconds', updated_at = now() WHERE id = $1`, c.ID, c.Attempt)
	} else {
		_, err = tx.Exec(ctx, `UPDATE `+d.table+` SET state = 'confirmed', attempts = $2, provider_ref = $3,
			fired_at = now(), confirmed_at = now(), next_attempt_at = NULL, updated_at = now() WHERE id = $1`, c.ID, c.Attempt, ref)
	}
	if err != nil {
		return true, err
	}
	return true, tx.Commit(ctx)
}
