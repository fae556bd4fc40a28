package idempotency

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit/internal/crashpoint"
	"github.com/oncekit/oncekit/internal/wait"
)

// ErrOwnershipLost is the cause of a Separate-mode handler's context being
// cancelled when its claim was recovered by another request (its lease could
// not be renewed in time).
var ErrOwnershipLost = errors.New("idempotency: claim recovered by another request")

// maxClaimAttempts bounds how often a request re-tries to claim a key that
// vanished between its claim and its lookup (released by a 5xx, say).
const maxClaimAttempts = 3

// serveSeparate: claim (committed), run the handler under a renewed lease,
// then store the response fenced by the claim's token.
func (rt *route) serveSeparate(next http.Handler, w http.ResponseWriter, r *http.Request, id recordID, fp []byte) {
	ctx := r.Context()
	deadline, waiting := time.Now().Add(rt.cfg.Wait), false
	defer func() {
		if waiting {
			rt.stopWaiting(id)
		}
	}()
	for attempt := 0; ; attempt++ {
		var token int64
		var recoveries int32
		err := rt.e.db.QueryRow(ctx, rt.e.sql.claim, id.tenant, id.operation, id.stored(), fp,
			micros(rt.cfg.Lease), micros(rt.cfg.KeyTTL), rt.cfg.RunExpiredRetries).Scan(&token, &recoveries)
		if err == nil {
			if rt.overKeyLimit(w, id, token) {
				// Nothing is to be stored: the fresh claim goes.
				if _, err := rt.e.db.Exec(context.WithoutCancel(ctx), rt.e.sql.unclaim, id.tenant, id.operation, id.stored(), token); err != nil {
					rt.e.log.Error("idempotency: dropping a rate-limited claim failed; it expires with its lease",
						"operation", id.operation, "key_hash", keyHash(id), "error", err)
				}
				return
			}
			rt.runSeparate(next, w, r, id, token, recoveries > 0)
			return
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			rt.storeFailed(w, id, fmt.Errorf("claim: %w", err))
			return
		}
		rec, found, err := rt.e.lookup(ctx, id)
		if err != nil {
			rt.storeFailed(w, id, err)
			return
		}
		if !found || (rec.state == StateReleased && subtle.ConstantTimeCompare(rec.fingerprint, fp) == 1) {
			if attempt+1 < maxClaimAttempts {
				continue // expired, or released with this body, meanwhile: claim again
			}
			rt.inProgress(w)
			return
		}
		if rec.state == StateInProgress && !waiting && rt.cfg.Wait > 0 {
			waiting = rt.startWaiting(id) // false: the key's MaxWaiters places are taken
		}
		waitMore := waiting && time.Now().Before(deadline)
		if rt.answerExisting(w, id, fp, &rec, waitMore) {
			return
		}
		if !wait.Sleep(ctx, min(rt.pollInterval(), time.Until(deadline))) {
			rt.inProgress(w)
			return
		}
		attempt = -1 // waiting: the attempt limit applies to vanishing records only
	}
}

// runSeparate runs the handler as the claim's owner (token).
func (rt *route) runSeparate(next http.Handler, w http.ResponseWriter, r *http.Request, id recordID, token int64, recovered bool) {
	outcome := OutcomeNew
	if recovered {
		outcome = OutcomeRecovered
		rt.e.log.Warn("idempotency: recovered an abandoned claim; re-running the handler",
			"operation", id.operation, "key_hash", keyHash(id), "token", token)
	}
	rt.count(outcome)
	crashpoint.Hit("idempotency.after-claim")

	bg := context.WithoutCancel(r.Context())
	hctx, cancel := context.WithCancelCause(r.Context())
	stopRenew := rt.renewLease(hctx, cancel, id, token)
	info := Info{Tenant: id.tenant, Operation: id.operation, Key: id.key, Token: token, Recovered: recovered}
	rw, panicked := runHandler(next, r.WithContext(withInfo(hctx, info)))
	stopRenew()
	cancel(nil)

	if panicked != nil || !rt.cfg.Store(rw.code()) {
		if _, err := rt.e.db.Exec(bg, rt.e.sql.release, id.tenant, id.operation, id.stored(), token, micros(rt.cfg.TTL)); err != nil {
			// The lease runs out and a retry recovers the claim.
			rt.e.log.Error("idempotency: release failed", "operation", id.operation, "key_hash", keyHash(id), "error", err)
		}
		rt.answerReleased(w, id, rw, panicked)
		return
	}

	crashpoint.Hit("idempotency.before-store")
	headers, body, sealed, err := rt.encode(id, rw)
	if err == nil {
		var tag pgconn.CommandTag
		tag, err = rt.e.db.Exec(bg, rt.e.sql.complete, id.tenant, id.operation, id.stored(), token,
			rw.code(), headers, body, sealed, micros(rt.cfg.KeyTTL), micros(rt.cfg.TTL))
		if err == nil && tag.RowsAffected() == 0 {
			rt.e.m.fenced.WithLabelValues(id.operation).Inc()
			rt.e.log.Warn("idempotency: claim was recovered by another request; response not stored",
				"operation", id.operation, "key_hash", keyHash(id), "token", token)
		} else if err == nil {
			rt.e.m.stored.WithLabelValues(id.operation).Inc()
		}
	}
	if err != nil {
		// The handler ran: its answer goes to the client. The claim stays
		// in_progress until its lease ends; a retry then recovers it.
		rt.e.log.Error("idempotency: storing the response failed", "operation", id.operation,
			"key_hash", keyHash(id), "error", err)
	}
	rw.sendTo(w)
}

// renewLease keeps the claim owned while the handler runs, renewing every
// Lease/3 until the returned func is called. It does not stop when ctx ends
// (the client hung up): a handler may still be running, and letting its lease
// lapse would let a retry recover the claim and execute alongside it. If the
// claim was taken over, the handler's context is cancelled with
// ErrOwnershipLost.
func (rt *route) renewLease(ctx context.Context, cancel context.CancelCauseFunc, id recordID, token int64) func() {
	ctx = context.WithoutCancel(ctx)
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(rt.cfg.Lease / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			// Bounded, so that a hung database cannot hold the request
			// open past its lease: the next tick tries again.
			rctx, rcancel := context.WithTimeout(ctx, rt.cfg.Lease/3)
			tag, err := rt.e.db.Exec(rctx, rt.e.sql.renew, id.tenant, id.operation, id.stored(), token,
				micros(rt.cfg.Lease))
			rcancel()
			if err != nil {
				rt.e.log.Warn("idempotency: lease renewal failed", "operation", id.operation,
					"key_hash", keyHash(id), "error", err)
				continue
			}
			if tag.RowsAffected() == 0 {
				rt.e.log.Error("idempotency: lost the claim to a recovering request; cancelling the handler",
					"operation", id.operation, "key_hash", keyHash(id), "token", token)
				cancel(ErrOwnershipLost)
				return
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}
