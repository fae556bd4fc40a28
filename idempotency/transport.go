package idempotency

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/oncekit/oncekit/internal/backoff"
	"github.com/oncekit/oncekit/internal/httpretry"
)

// Transport is the client side of the edge's contract, an http.RoundTripper:
// it sends one Idempotency-Key with every attempt of a request (the request's
// own, or a new one per request when it has none), retries a POST or PATCH
// whose answer is lost or "not now" (a transport error, 408, 409 in
// progress, 425, 429, 5xx) with bounded, jittered backoff, and honours
// Retry-After. An answer that the outcome is unknown (409
// IDEMPOTENCY_OUTCOME_UNKNOWN) is not retried blindly: the Transport polls
// the status resource it links (with the request's headers, its
// credentials among them) until the record is settled, for at most
// MaxUnknownWait, and then retries to get the settled answer. Any other
// answer, 422 IDEMPOTENCY_KEY_REUSED and the other 4xx among them, is
// returned at once. A request that must survive a process restart sets its
// key itself, kept with the intent (docs/clients.md).
type Transport struct {
	// Base sends each attempt. Defaults to http.DefaultTransport.
	Base http.RoundTripper
	// MaxAttempts bounds the attempts per request. Defaults to 5.
	MaxAttempts int
	// MinBackoff and MaxBackoff bound the wait between attempts: full
	// jitter up to MinBackoff doubled per attempt, at most MaxBackoff; a
	// Retry-After up to MaxRetryAfter wins. Default to 100ms and 5s.
	MinBackoff, MaxBackoff time.Duration
	// MaxRetryAfter caps the wait a Retry-After may ask for; a longer one
	// ends the retries and returns the answer. Defaults to 30s.
	MaxRetryAfter time.Duration
	// MaxUnknownWait bounds how long one unknown answer is followed on its
	// status resource before it is returned as it is. Defaults to 1 minute.
	MaxUnknownWait time.Duration
	// RetryBudget bounds the retries of all the Transport's requests
	// together, as a token bucket of RetryBudget tokens: a retry takes
	// one, and an attempt the server answers (anything but a 5xx or a
	// lost answer) gives back RetryRefill. With no token left a request
	// returns its last answer (or its error, wrapping
	// ErrRetryBudgetExhausted). Defaults to 20; negative: no budget.
	RetryBudget int
	// RetryRefill is the part of a token an answered attempt gives back.
	// Defaults to 0.2: at most one retry for five answers in the long run.
	RetryRefill float64
	// BreakerThreshold is how many attempts in a row, across requests,
	// answered 5xx or lost open the breaker: for BreakerCooldown every
	// request fails at once with ErrCircuitOpen, sending nothing; then one
	// request goes through as a probe, and closes the breaker if answered
	// or opens it again for twice as long (up to 16 times
	// BreakerCooldown). Defaults to 10; negative: no breaker.
	BreakerThreshold int
	// BreakerCooldown is how long the breaker stays open. Defaults to 5s.
	BreakerCooldown time.Duration

	once  sync.Once
	state *retryState
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	if req.Method != http.MethodPost && req.Method != http.MethodPatch {
		return base.RoundTrip(req)
	}
	key := req.Header.Get(HeaderKey)
	if key == "" {
		key = rand.Text() // one new intent: one key for all its attempts
	}
	body, err := replayableBody(req)
	if err != nil {
		return nil, err
	}
	st := t.shared()
	probe, err := st.admit(time.Now())
	if err != nil {
		return nil, err
	}
	defer func() {
		if probe { // ended before its first answer: another request probes
			st.abandon()
		}
	}()
	attempts := cmp.Or(t.MaxAttempts, 5)
	bo := backoff.Policy{Min: cmp.Or(t.MinBackoff, 100*time.Millisecond), Max: cmp.Or(t.MaxBackoff, 5*time.Second), FullJitter: true}
	maxRA := cmp.Or(t.MaxRetryAfter, 30*time.Second)
	for attempt := 1; ; attempt++ {
		r := req.Clone(req.Context())
		r.Header.Set(HeaderKey, key)
		if body != nil {
			if r.Body, err = body(); err != nil {
				return nil, err
			}
		}
		resp, err := base.RoundTrip(r)
		open := st.done(time.Now(), failedAttempt(resp, err), probe)
		probe = false
		if err == nil && resp.StatusCode == http.StatusConflict {
			if monitor, ok := unknownOutcome(resp, r.URL); ok {
				if attempt >= attempts || !t.awaitSettled(req, base, monitor, bo) {
					return resp, nil // still unknown: the caller decides
				}
				_ = resp.Body.Close()
				continue // settled: the retry gets the answer
			}
		}
		if err == nil && !httpretry.Retryable(resp.StatusCode) {
			return resp, nil
		}
		delay := bo.Delay(attempt)
		if err == nil {
			if d, ok := httpretry.After(resp.Header.Get("Retry-After"), time.Now()); ok {
				if d > maxRA {
					return resp, nil // asked to wait longer than allowed: the caller decides
				}
				delay = d
			}
		}
		if attempt >= attempts || req.Context().Err() != nil || open || !beforeDeadline(req, delay) {
			return resp, err
		}
		if !st.spend() {
			if err != nil {
				err = fmt.Errorf("%w: %w", ErrRetryBudgetExhausted, err)
			}
			return resp, err
		}
		if resp != nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
			_ = resp.Body.Close()
		}
		select {
		case <-req.Context().Done():
			return nil, req.Context().Err()
		case <-time.After(delay):
		}
	}
}

// replayableBody returns a function that opens the request's body afresh
// for each attempt, or nil for a request without one.
func replayableBody(req *http.Request) (func() (io.ReadCloser, error), error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	if req.GetBody != nil {
		return req.GetBody, nil
	}
	b, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("idempotency: Transport: read the body: %w", err)
	}
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }, nil
}

// unknownOutcome reports whether resp answers IDEMPOTENCY_OUTCOME_UNKNOWN
// with a status resource to follow, and returns that resource's URL
// (resolved against sent, the request's). It reads the body and puts it
// back.
func unknownOutcome(resp *http.Response, sent *url.URL) (*url.URL, bool) {
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		return nil, false
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	_ = resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(b))
	if err != nil {
		return nil, false
	}
	var p struct {
		Code     string `json:"code"`
		Instance string `json:"instance"`
	}
	if json.Unmarshal(b, &p) != nil || p.Code != CodeOutcomeUnknown || p.Instance == "" {
		return nil, false
	}
	ref, err := url.Parse(p.Instance)
	if err != nil {
		return nil, false
	}
	return sent.ResolveReference(ref), true
}

// awaitSettled polls the status resource at monitor, with req's headers,
// until the record is no longer unknown or in progress (or is gone), and
// reports whether it was settled within MaxUnknownWait.
func (t *Transport) awaitSettled(req *http.Request, base http.RoundTripper, monitor *url.URL, bo backoff.Policy) bool {
	ctx := req.Context()
	deadline := time.Now().Add(cmp.Or(t.MaxUnknownWait, time.Minute))
	for poll := 1; time.Now().Before(deadline); poll++ {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(min(bo.Delay(poll), time.Until(deadline))):
		}
		get, err := http.NewRequestWithContext(ctx, http.MethodGet, monitor.String(), nil)
		if err != nil {
			return false
		}
		get.Header = req.Header.Clone()
		get.Header.Del("Content-Type")
		get.Header.Del("Content-Length")
		resp, err := base.RoundTrip(get)
		if err != nil {
			continue // lost: poll again
		}
		var st Status
		decoded := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&st) == nil
		_ = resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusNotFound:
			return true // no record: the retry runs the request, or is told why not
		case resp.StatusCode == http.StatusOK && decoded && st.State != StateUnknown && st.State != StateInProgress:
			return true
		}
	}
	return false
}

// beforeDeadline reports whether a retry after delay would start before
// the request's context deadline (always, without one): a retry that
// could not be sent in time is not waited for.
func beforeDeadline(req *http.Request, delay time.Duration) bool {
	deadline, ok := req.Context().Deadline()
	return !ok || time.Now().Add(delay).Before(deadline)
}
