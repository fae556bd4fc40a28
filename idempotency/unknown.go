package idempotency

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/oncekit/oncekit/internal/untrusted"
)

// ErrNotInRoute is returned by Unknown for a request that did not come
// through an idempotent route's claim.
var ErrNotInRoute = errors.New("idempotency: the request holds no claim")

// maxReasonBytes bounds an unknown's stored reason.
const maxReasonBytes = 1024

// outcome is what a handler says of its own request beyond its response.
type outcome struct {
	unknown bool
	reason  string
}

type outcomeKey struct{}

// Unknown ends r's request with an unknown outcome: the handler cannot
// prove what happened (a provider call whose answer was lost, say), so
// neither its response nor a retry that runs it again would be honest. Once
// the handler returns, whatever it wrote is discarded; the record becomes
// unknown with reason (kept for operators; never shown to clients), and
// this request and every retry are answered 409 IDEMPOTENCY_OUTCOME_UNKNOWN
// until Route.UnknownOutcomes.Reconcile or an operator (Edge.Resolve) settles it. In
// SameTx mode the handler's writes commit with the unknown record. Called
// from Route.UnknownOutcomes.Reconcile, it replaces the reason.
func Unknown(r *http.Request, reason string) error {
	o, ok := r.Context().Value(outcomeKey{}).(*outcome)
	if !ok {
		return ErrNotInRoute
	}
	o.unknown, o.reason = true, storableReason(reason)
	return nil
}

// storableReason is reason as the record keeps it: valid UTF-8 without NUL
// (PostgreSQL refuses both), at most maxReasonBytes.
func storableReason(reason string) string {
	s := untrusted.Text(reason, maxReasonBytes)
	if s == "" {
		return "unknown"
	}
	return s
}

func withOutcome(ctx context.Context) (context.Context, *outcome) {
	o := &outcome{}
	return context.WithValue(ctx, outcomeKey{}, o), o
}

// InDoubt is a request in doubt, as Route.UnknownOutcomes.Reconcile receives it: a retry
// that took over a record whose outcome the edge cannot prove (a claim
// whose owner died, or a record a handler left unknown). It is not the
// operators' list of unsettled records (Edge.Unsettled), nor the records
// Edge.Resolve accepts.
type InDoubt struct {
	// Info is the request's identity; Token is the new claim's.
	Info
	// State is StateInProgress when the previous owner died mid-handler
	// (its lease ran out), StateUnknown when a handler or an earlier
	// reconciliation said unknown.
	State State
	// Reason is the unknown's reason ("" for a dead owner's claim).
	Reason string
	// Since is when the request was first claimed.
	Since time.Time
}

// Verdict is Route.UnknownOutcomes.Reconcile's decision.
type Verdict int

const (
	// StillUnknown keeps (or makes) the record unknown: the request and its
	// retries are answered IDEMPOTENCY_OUTCOME_UNKNOWN until settled. Call
	// Unknown to give the reason.
	StillUnknown Verdict = iota
	// Settled: the operation happened, and what Reconcile wrote to w (the
	// response the request should have had, rebuilt from the resource or the
	// provider's answer) is stored and replayed from now on, whatever its
	// status.
	Settled
	// RunAgain: the operation did not happen; the handler runs under the
	// claim (Info.Recovered is true), as a retry after a release would.
	RunAgain
)

// String returns "still_unknown", "settled" or "run_again", the label of
// oncekit_idempotency_reconciled_total.
func (v Verdict) String() string {
	switch v {
	case Settled:
		return "settled"
	case RunAgain:
		return "run_again"
	}
	return "still_unknown"
}

// statusLink is the route's status resource for id's record, addressed by
// the key's digest (never the key), "" without UnknownOutcomes.StatusPath.
func (rt *route) statusLink(id recordID) string {
	if rt.cfg.UnknownOutcomes.StatusPath == "" {
		return ""
	}
	return strings.Replace(rt.cfg.UnknownOutcomes.StatusPath, "{digest}", id.stored(), 1)
}

// answerUnknown answers 409 IDEMPOTENCY_OUTCOME_UNKNOWN, linking the status
// resource.
func (rt *route) answerUnknown(w http.ResponseWriter, id recordID) {
	rt.count(OutcomeUnknown)
	link := rt.statusLink(id)
	if link != "" {
		w.Header().Set("Link", "<"+link+`>; rel="monitor"`)
	}
	writeProblemAt(w, http.StatusConflict, CodeOutcomeUnknown,
		"the outcome of the request under this Idempotency-Key is not known yet; do not retry blindly: poll the status resource, then retry with the same key",
		link, rt.retryAfterSeconds())
}
