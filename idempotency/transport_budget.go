package idempotency

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync"
	"time"
)

// ErrCircuitOpen is returned by Transport.RoundTrip, without sending the
// request, while the server has kept failing (BreakerThreshold attempts
// in a row answered 5xx or lost) and the breaker's cooldown runs. Nothing
// was sent: the request may be made again later under the same key.
var ErrCircuitOpen = errors.New("idempotency: Transport: circuit open: the server keeps failing")

// ErrRetryBudgetExhausted is wrapped by the error Transport.RoundTrip
// returns when a lost answer would be retried but the retries of all its
// requests together have spent the RetryBudget. An answer (a 503, say)
// is returned as it is instead.
var ErrRetryBudgetExhausted = errors.New("idempotency: Transport: retry budget exhausted")

// maxCooldownGrowth bounds how far failed probes stretch the cooldown.
const maxCooldownGrowth = 16

// retryState is what a Transport's requests share: the retry budget's
// tokens and the breaker.
type retryState struct {
	mu       sync.Mutex
	capacity float64 // +Inf: no budget
	refill   float64
	tokens   float64

	threshold    int // 0: no breaker
	baseCooldown time.Duration
	cooldown     time.Duration
	failures     int // attempts in a row that failed
	openUntil    time.Time
	probing      bool // a request is the half-open breaker's probe
}

// shared returns the Transport's shared state, made at its first use.
func (t *Transport) shared() *retryState {
	t.once.Do(func() {
		st := &retryState{capacity: math.Inf(1), refill: cmp.Or(t.RetryRefill, 0.2),
			baseCooldown: cmp.Or(t.BreakerCooldown, 5*time.Second)}
		if !(st.refill > 0) { // NaN or negative
			st.refill = 0.2
		}
		if t.RetryBudget >= 0 {
			st.capacity = float64(cmp.Or(t.RetryBudget, 20))
		}
		if t.BreakerThreshold >= 0 {
			st.threshold = cmp.Or(t.BreakerThreshold, 10)
		}
		st.tokens, st.cooldown = st.capacity, st.baseCooldown
		t.state = st
	})
	return t.state
}

// admit lets a request send its first attempt, or refuses it while the
// breaker is open; once the cooldown ran, one request is let through as
// the probe (probe true).
func (s *retryState) admit(now time.Time) (probe bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.threshold == 0 || s.failures < s.threshold {
		return false, nil
	}
	if now.Before(s.openUntil) || s.probing {
		return false, fmt.Errorf("%w: %d failed attempts in a row; next try after %s",
			ErrCircuitOpen, s.failures, s.openUntil.Format(time.RFC3339Nano))
	}
	s.probing = true
	return true, nil
}

// done records an attempt's result: failed (a 5xx or a lost answer), or
// answered (anything else: the server works). It reports whether the
// breaker is open after it.
func (s *retryState) done(now time.Time, failed, probe bool) (open bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if probe {
		s.probing = false
	}
	if !failed {
		s.failures, s.cooldown = 0, s.baseCooldown
		s.tokens = min(s.capacity, s.tokens+s.refill)
		return false
	}
	s.failures++
	if s.threshold == 0 || s.failures < s.threshold {
		return false
	}
	if probe {
		s.cooldown = min(2*s.cooldown, maxCooldownGrowth*s.baseCooldown)
	}
	s.openUntil = now.Add(s.cooldown)
	return true
}

// abandon gives up the probe of a request that ended before its answer.
func (s *retryState) abandon() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.probing = false
}

// spend takes a token for one retry, or reports false when none is left.
func (s *retryState) spend() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tokens < 1 {
		return false
	}
	s.tokens--
	return true
}

// failedAttempt reports whether an attempt's result counts against the
// server: a lost answer or a 5xx.
func failedAttempt(resp *http.Response, err error) bool {
	return err != nil || resp.StatusCode >= 500
}
