package idempotency

import (
	"cmp"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/crashpoint"
	"github.com/oncekit/oncekit/internal/pgsql"
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
	deadline, waiting := time.Now().Add(rt.cfg.waitFor()), false
	defer func() {
		if waiting {
			rt.stopWaiting(id)
		}
	}()
	for attempt := 0; ; attempt++ {
		var c separateClaim
		err := rt.e.db.QueryRow(ctx, rt.e.sql.claim, id.tenant, id.operation, id.stored(), fp,
			micros(rt.cfg.Lease), micros(rt.cfg.KeyTTL), rt.cfg.Responses.RunExpiredRetries, rt.cfg.UnknownOutcomes.Reconcile != nil, id.operationID()).
			Scan(&c.token, &c.recoveries, &c.reason, &c.wasUnknown)
		if err == nil || errors.Is(err, pgx.ErrNoRows) {
			rt.e.watch.OK("store")
		}
		if err == nil {
			if rt.overKeyLimit(w, id, c.token) || !rt.claimBusinessKeyApart(w, r, id, fp) {
				// Nothing is to be stored: the fresh claim goes.
				rt.unclaim(ctx, id, c.token)
				return
			}
			rt.runSeparate(next, w, r, id, c)
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
		if rec.state == StateInProgress && !waiting && rt.cfg.waitFor() > 0 {
			waiting = rt.startWaiting(id) // false: the key's Waiting.MaxWaiters places are taken
		}
		synced, found, err := rt.e.replicated(ctx, id, &rec)
		if err != nil {
			rt.storeFailed(w, id, err)
			return
		}
		if !found {
			if attempt+1 < maxClaimAttempts {
				continue // gone meanwhile: claim again
			}
			rt.inProgress(w)
			return
		}
		waitMore := waiting && time.Now().Before(deadline)
		if rt.answerExisting(w, id, fp, synced, waitMore) {
			return
		}
		if !wait.Sleep(ctx, min(rt.pollInterval(), time.Until(deadline))) {
			rt.inProgress(w)
			return
		}
		attempt = -1 // waiting: the attempt limit applies to vanishing records only
	}
}

// separateClaim is what a Separate-mode claim returns.
type separateClaim struct {
	token      int64
	recoveries int32
	reason     string // the unknown's, when the claim took over one
	wasUnknown bool   // the claim took over an unknown record (or one being reconciled)
}

// unclaim drops a fresh claim whose request is not to run.
func (rt *route) unclaim(ctx context.Context, id recordID, token int64) {
	if _, err := rt.e.db.Exec(context.WithoutCancel(ctx), rt.e.sql.unclaim, id.tenant, id.operation, id.stored(), token); err != nil {
		rt.e.log.Error("idempotency: dropping a claim that is not to run failed; it expires with its lease",
			"operation", id.operation, "key_hash", keyHash(id), "error", err)
	}
}

// runSeparate runs the handler as the claim's owner, or, for a recovered
// claim on a route that reconciles, Route.UnknownOutcomes.Reconcile first.
func (rt *route) runSeparate(next http.Handler, w http.ResponseWriter, r *http.Request, id recordID, c separateClaim) {
	recovered := c.recoveries > 0
	crashpoint.Hit("idempotency.after-claim")

	bg := context.WithoutCancel(r.Context())
	hctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	stopRenew := rt.renewLease(hctx, cancel, id, c.token)
	info := Info{Tenant: id.tenant, Operation: id.operation, Key: id.key, Token: c.token, Recovered: recovered}
	items := &itemScope{rt: rt, id: id, token: c.token}
	hctx, out := withOutcome(context.WithValue(withInfo(hctx, info), itemsKey{}, items))
	req := r.WithContext(hctx)

	if recovered && rt.cfg.UnknownOutcomes.Reconcile != nil {
		rt.count(OutcomeReconciled)
		u := InDoubt{Info: info, State: StateInProgress, Reason: c.reason}
		if c.wasUnknown {
			u.State = StateUnknown
		}
		rw, verdict, panicked := rt.reconcile(req, u)
		rt.e.m.reconciled.WithLabelValues(id.operation, verdict.String()).Inc()
		switch {
		case panicked != nil:
			stopRenew()
			rt.settleUnknown(bg, w, id, c.token, storableReason(fmt.Sprint("reconcile panicked: ", panicked)))
			panic(panicked)
		case verdict == Settled:
			stopRenew()
			rt.store(bg, w, id, c.token, rw, items.used.Load())
			return
		case verdict != RunAgain:
			stopRenew()
			reason := cmp.Or(out.reason, c.reason, "reconcile could not settle it")
			rt.settleUnknown(bg, w, id, c.token, reason)
			return
		}
		rt.e.log.Info("idempotency: reconcile says the request had no effect; running the handler",
			"operation", id.operation, "key_hash", keyHash(id), "token", c.token)
		*out = outcome{}
	} else if recovered {
		rt.count(OutcomeRecovered)
		rt.e.log.Warn("idempotency: recovered an abandoned claim; re-running the handler",
			"operation", id.operation, "key_hash", keyHash(id), "token", c.token)
	} else {
		rt.countNew(id)
	}
	rw, panicked := runHandler(next, req)
	stopRenew()

	switch {
	case out.unknown && panicked == nil:
		rt.settleUnknown(bg, w, id, c.token, out.reason)
		return
	case panicked != nil || rt.releases(rw):
		if _, err := rt.e.db.Exec(bg, rt.e.sql.release, id.tenant, id.operation, id.stored(), c.token,
			micros(rt.cfg.TTL), rt.cfg.BusinessKey != nil, storableCode(rw, panicked)); err != nil {
			// The lease runs out and a retry recovers the claim.
			rt.e.log.Error("idempotency: release failed", "operation", id.operation, "key_hash", keyHash(id), "error", err)
		}
		rt.answerReleased(w, id, rw, panicked)
		return
	}
	crashpoint.Hit("idempotency.before-store")
	rt.store(bg, w, id, c.token, rw, items.used.Load())
}

// reconcile runs Route.UnknownOutcomes.Reconcile with a recorder.
func (rt *route) reconcile(r *http.Request, u InDoubt) (rw *recorder, v Verdict, panicked any) {
	rw = newRecorder()
	defer func() { panicked = recover() }()
	return rw, rt.cfg.UnknownOutcomes.Reconcile(rw, r, u), nil
}

// store stores rw's response under the claim (token) and sends it; with
// items, the outcomes of the request's items (Item) go with it.
func (rt *route) store(ctx context.Context, w http.ResponseWriter, id recordID, token int64, rw *recorder, items bool) {
	headers, body, sealed, err := rt.encode(id, rw)
	if err == nil {
		var n int64
		complete := rt.e.sql.complete
		if items {
			complete = rt.e.sql.completeItems
		}
		err = rt.e.db.QueryRow(ctx, complete, id.tenant, id.operation, id.stored(), token,
			rw.code(), pgsql.JSON(headers), body, sealed, micros(rt.cfg.KeyTTL), micros(rt.cfg.TTL),
			rt.cfg.responseVersion(), rt.businessLocation(rw), storableCode(rw, nil)).Scan(&n)
		if err == nil && n == 0 {
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

// settleUnknown records the claim (token) as unknown with reason and
// answers so.
func (rt *route) settleUnknown(ctx context.Context, w http.ResponseWriter, id recordID, token int64, reason string) {
	rt.e.m.unknown.WithLabelValues(id.operation).Inc()
	rt.e.log.Warn("idempotency: the request's outcome is unknown", "operation", id.operation,
		"key_hash", keyHash(id), "token", token, "reason", reason)
	var n int64
	if err := rt.e.db.QueryRow(ctx, rt.e.sql.unknown, id.tenant, id.operation, id.stored(), token, reason,
		micros(rt.cfg.KeyTTL)).Scan(&n); err != nil {
		// The claim stays in_progress: once its lease ends, the next retry
		// recovers it (and reconciles, when the route does).
		rt.e.log.Error("idempotency: recording the unknown outcome failed", "operation", id.operation,
			"key_hash", keyHash(id), "error", err)
	}
	rt.answerUnknown(w, id)
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
