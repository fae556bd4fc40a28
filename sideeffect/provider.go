package sideeffect

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/tracecontext"
)

// Call is one attempt to cause an effect.
type Call struct {
	// ID is the effect's row ID.
	ID int64
	// Key is the effect's idempotency key. It is the same on every attempt,
	// after every crash and on every dispatcher; pass it to the downstream
	// system so that a repeat is a no-op.
	Key string
	// Kind is the effect's kind.
	Kind string
	// SourceID is what caused the effect.
	SourceID string
	// Payload is the recorded payload.
	Payload []byte
	// Attempt counts calls with this key, from 1.
	Attempt int
	// RecordedAt is when the effect was recorded.
	RecordedAt time.Time
	// Trace is the trace context Record found in its ctx (traceparent and
	// tracestate with the default propagator), or nil. The dispatcher also
	// puts it into the ctx of Call through DispatcherConfig.Propagator; a
	// provider that makes an HTTP request sends these headers with it.
	Trace tracecontext.Carrier
}

// Provider causes effects of one kind.
//
// Call must pass c.Key to the downstream system so that a second call with
// the same key does not act twice: the dispatcher repeats calls after
// indefinite errors and after crashes. It returns the provider's reference
// for the effect (a message ID, a charge ID; may be empty). An error is
// indefinite (the provider may have acted; retried with the same key)
// unless marked with Definite. Call must return when ctx ends.
//
// A provider that cannot honour keys implements KeyHonourer and returns
// false; one that can tell whether a key was acted on implements Looker.
type Provider interface {
	Call(ctx context.Context, c Call) (ref string, err error)
}

// ProviderFunc adapts a function to Provider (honouring keys, no lookup).
type ProviderFunc func(ctx context.Context, c Call) (string, error)

// Call calls f.
func (f ProviderFunc) Call(ctx context.Context, c Call) (string, error) { return f(ctx, c) }

// KeyHonourer is implemented by a Provider that states whether the
// downstream system dedups on the key. A Provider that does not implement it
// is taken to honour keys. When HonoursKeys is false, the dispatcher never
// repeats a call whose outcome it cannot prove: after an indefinite error or
// a crash mid-call it reconciles through Lookup if the provider is a Looker,
// else the effect becomes unknown.
type KeyHonourer interface {
	HonoursKeys() bool
}

// Looker is implemented by a Provider that can tell whether it acted on a
// key. found with a nil error means it did, and ref is its reference; not
// found with a nil error must mean it did not and no earlier call can still
// act. Errors are retried later.
type Looker interface {
	Lookup(ctx context.Context, key string) (ref string, found bool, err error)
}

// Bounded is implemented by a Provider that bounds each call itself.
// The dispatcher then gives a call the shorter of CallTimeout and
// CallBound as its deadline, so the provider's own bound is already in
// the context and one timer covers the call, not two.
type Bounded interface {
	CallBound() time.Duration
}

// ErrDuplicate marks a successful call that the provider reports as a
// replay: it had already acted on this key, and ref is the original
// reference. Return it (wrapped or not) together with the ref; the effect
// is confirmed and the report is counted.
var ErrDuplicate = errors.New("sideeffect: provider reports a duplicate")

// Error is a classified provider error.
type Error struct {
	// Err is the underlying error.
	Err error
	// Definite is true when the provider certainly did not act.
	Definite bool
	// RetryAfter, when positive, is how long the provider asked to wait
	// before the next attempt (an indefinite error).
	RetryAfter time.Duration
}

// Error returns the underlying message.
func (e *Error) Error() string {
	if e.Definite {
		return "definite: " + e.Err.Error()
	}
	if e.RetryAfter > 0 {
		return fmt.Sprintf("%v (retry after %s)", e.Err, e.RetryAfter)
	}
	return e.Err.Error()
}

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// Definite marks err as definite: the provider certainly did not act (a
// validation error, a rejected request). The effect becomes failed and is not
// retried. A nil err stays nil.
func Definite(err error) error {
	if err == nil {
		return nil
	}
	return &Error{Err: err, Definite: true}
}

// RetryAfter marks err as indefinite with the provider's requested delay
// before the next attempt (HTTP Retry-After). A nil err stays nil.
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &Error{Err: err, RetryAfter: d}
}

// IsDefinite reports whether err was marked with Definite. Every other error
// is indefinite.
func IsDefinite(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Definite
}

// RetryAfterOf returns the delay requested with RetryAfter, if any.
func RetryAfterOf(err error) (time.Duration, bool) {
	var e *Error
	if errors.As(err, &e) && !e.Definite && e.RetryAfter > 0 {
		return e.RetryAfter, true
	}
	return 0, false
}

// capabilities of a provider, read once at construction.
type capabilities struct {
	provider    Provider
	honoursKeys bool
	looker      Looker        // nil when none
	timeout     time.Duration // bounds each call: CallTimeout or a shorter CallBound
	m           *kindMetrics  // set by NewDispatcher
}

func capabilitiesOf(p Provider, callTimeout time.Duration) capabilities {
	c := capabilities{provider: p, honoursKeys: true, timeout: callTimeout}
	if b, ok := p.(Bounded); ok {
		if d := b.CallBound(); d > 0 && d < callTimeout {
			c.timeout = d
		}
	}
	if kh, ok := p.(KeyHonourer); ok {
		c.honoursKeys = kh.HonoursKeys()
	}
	if lk, ok := p.(Looker); ok {
		c.looker = lk
	}
	return c
}
