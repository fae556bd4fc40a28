package sideeffect

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/internal/untrusted"
)

// outcome is the new state of a fired row, committed in batches.
type outcome struct {
	id      int64
	attempt int
	kind    string
	// state is confirmed, failed, unknown, pending (retry after delay),
	// fired (reconcile through lookup after delay) or released (claimed
	// but never called: back to pending, attempt not counted).
	state string
	ref   *string
	err   *string
	delay time.Duration
}

// Caps on what an effect's text columns hold of a provider's answer.
const (
	maxErrBytes = 2000
	maxRefBytes = 512
)

// errText is err's text as last_error holds it: valid UTF-8 without NUL,
// cut on a character boundary within maxErrBytes. A provider's error (an
// error page, a broker's reason) is untrusted.
func errText(err error) *string {
	s := untrusted.Text(err.Error(), maxErrBytes)
	return &s
}

// refText is a provider's reference as provider_ref holds it: made
// storable, within maxRefBytes.
func refText(ref string) *string {
	s := untrusted.Text(ref, maxRefBytes)
	return &s
}

// release puts back a claimed row that was not called.
func (d *Dispatcher) release(j job) outcome {
	o := outcome{id: j.call.ID, attempt: j.call.Attempt, kind: j.call.Kind, state: "released"}
	if j.lookup {
		o.state = string(StateFired) // lease expires now: reconciled by the next recovery
	}
	return o
}

// do calls the provider (or its lookup) with ctx, which bounds the call and
// is not cancelled by shutdown (see work), and classifies the result.
func (d *Dispatcher) do(cctx context.Context, j job) outcome {
	c := j.call
	o := outcome{id: c.ID, attempt: c.Attempt, kind: c.Kind}
	if c.Trace != nil {
		cctx = d.ledger.prop.Extract(cctx, c.Trace)
	}
	if j.lookup {
		return d.reconcile(cctx, j, o)
	}
	start := time.Now()
	ref, err := j.caps.provider.Call(cctx, c)
	j.caps.m.callSeconds.Observe(time.Since(start).Seconds())
	switch {
	case err == nil:
		j.caps.m.callsOK.Inc()
		o.state, o.ref = string(StateConfirmed), refText(ref)
		return o
	case errors.Is(err, ErrDuplicate):
		d.m.duplicates.WithLabelValues(c.Kind).Inc()
		d.m.calls.WithLabelValues(c.Kind, "duplicate").Inc()
		o.state, o.ref = string(StateConfirmed), refText(ref)
		return o
	case IsDefinite(err):
		d.m.calls.WithLabelValues(c.Kind, "definite").Inc()
		o.state, o.err = string(StateFailed), errText(err)
		d.log.Warn("effect failed", "id", c.ID, "kind", c.Kind, "attempt", c.Attempt, "err", err)
		return o
	}
	d.m.calls.WithLabelValues(c.Kind, "indefinite").Inc()
	o.err = errText(err)
	switch {
	case c.Attempt >= d.cfg.MaxAttempts:
		o.state = string(StateUnknown)
		o.err = errText(fmt.Errorf("gave up after %d attempts, the provider may have acted: %w", c.Attempt, err))
	case j.caps.honoursKeys:
		o.state, o.delay = string(StatePending), d.retryDelay(c.Attempt, err)
	case j.caps.looker != nil:
		o.state, o.delay = string(StateFired), d.retryDelay(c.Attempt, err)
	default:
		o.state = string(StateUnknown)
		o.err = errText(fmt.Errorf("indefinite error and the provider does not honour keys: %w", err))
	}
	d.log.Info("effect call did not confirm", "id", c.ID, "kind", c.Kind, "attempt", c.Attempt,
		"next", o.state, "delay", o.delay, "err", err)
	return o
}

// reconcile asks a provider that does not honour keys whether it acted.
func (d *Dispatcher) reconcile(ctx context.Context, j job, o outcome) outcome {
	ref, found, err := j.caps.looker.Lookup(ctx, j.call.Key)
	switch {
	case err != nil:
		d.m.calls.WithLabelValues(o.kind, "lookup_error").Inc()
		o.state, o.err, o.delay = string(StateFired), errText(fmt.Errorf("lookup: %w", err)), d.retryDelay(o.attempt, err)
	case found:
		d.m.calls.WithLabelValues(o.kind, "lookup_found").Inc()
		o.state, o.ref = string(StateConfirmed), refText(ref)
	default:
		// The provider did not act: firing again with the same key is safe.
		d.m.calls.WithLabelValues(o.kind, "lookup_missing").Inc()
		o.state = string(StatePending)
	}
	return o
}

// retryDelay is the provider's Retry-After (capped) or the backoff for the
// attempt that just failed.
func (d *Dispatcher) retryDelay(attempt int, err error) time.Duration {
	if ra, ok := RetryAfterOf(err); ok {
		return min(ra, d.cfg.MaxRetryAfter)
	}
	return d.callBackoff().Delay(attempt)
}
