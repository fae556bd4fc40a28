package sideeffect_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/sideeffect"
	"github.com/oncekit/oncekit/sideeffect/webhook"
)

func TestDispatchConfirmsOncePerKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t)
	keys := b.record(t, "order.paid", 50)
	reg := prometheus.NewRegistry()
	cfg := fastConfig(b)
	cfg.Registerer = reg
	start(t, b, map[string]sideeffect.Provider{"order.paid": hook(rc, nil)}, cfg)

	b.waitState(t, sideeffect.StateConfirmed, 50, 20*time.Second)
	rc.check(t, keys)
	for _, k := range keys {
		require.Equal(t, 1, rc.callsOf(k))
		r := b.rowByKey(t, k)
		require.Equal(t, 1, r.Attempts)
		require.Equal(t, "ref-"+k[:12], r.ProviderRef)
		require.NotNil(t, r.FiredAt)
		require.NotNil(t, r.ConfirmedAt)
		require.Empty(t, r.LeaseOwner)
	}
	require.Equal(t, 50.0, metric(t, reg, "oncekit_sideeffect_transitions_total", map[string]string{"kind": "order.paid", "state": "confirmed"}))
	require.Equal(t, 50.0, metric(t, reg, "oncekit_sideeffect_transitions_total", map[string]string{"kind": "order.paid", "state": "fired"}))
	require.Equal(t, 50.0, metric(t, reg, "oncekit_sideeffect_fired_to_confirmed_seconds", map[string]string{"kind": "order.paid"}))
}

func TestDispatchLeavesOtherKindsAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t)
	keys := b.record(t, "mine", 3)
	b.record(t, "theirs", 2)
	start(t, b, map[string]sideeffect.Provider{"mine": hook(rc, nil)}, fastConfig(b))
	b.waitState(t, sideeffect.StateConfirmed, 3, 10*time.Second)
	rc.check(t, keys)
	require.Equal(t, 2, b.countState(t, sideeffect.StatePending))
}

func TestTimeoutTwiceThenSuccessIsOneEffectWithOneKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t)
	// The provider acts, then never answers in time, twice; the third call
	// answers. The effect must happen once, every call with the same key.
	rc.setHook(func(w http.ResponseWriter, r *http.Request, key string, n int) bool {
		if n <= 2 {
			rc.record(key)
			waitCtx(r.Context())
			return true
		}
		return false
	})
	keys := b.record(t, "capture", 1)
	reg := prometheus.NewRegistry()
	cfg := fastConfig(b)
	cfg.Registerer = reg
	start(t, b, map[string]sideeffect.Provider{"capture": hook(rc, &webhook.Config{Timeout: 500 * time.Millisecond})}, cfg)

	b.waitState(t, sideeffect.StateConfirmed, 1, 20*time.Second)
	rc.check(t, keys)
	require.Equal(t, 3, rc.callsOf(keys[0]), "two timeouts and one success, all with the same key")
	require.Equal(t, 3, rc.totalCalls(), "no call under another key")
	r := b.rowByKey(t, keys[0])
	require.Equal(t, 3, r.Attempts)
	require.Equal(t, 1.0, metric(t, reg, "oncekit_sideeffect_provider_duplicates_total", map[string]string{"kind": "capture"}))
	require.Equal(t, 2.0, metric(t, reg, "oncekit_sideeffect_provider_calls_total", map[string]string{"kind": "capture", "outcome": "indefinite"}))
}

func TestDefinite422FailsWithoutRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t)
	rejected := b.record(t, "invalid", 1)[0]
	rc.setHook(func(w http.ResponseWriter, r *http.Request, key string, n int) bool {
		if key == rejected {
			http.Error(w, `{"error":"bad address"}`, http.StatusUnprocessableEntity)
			return true
		}
		return false
	})
	cfg := fastConfig(b)
	start(t, b, map[string]sideeffect.Provider{"invalid": hook(rc, nil), "probe": hook(rc, nil)}, cfg)
	b.waitState(t, sideeffect.StateFailed, 1, 10*time.Second)
	r := b.rowByKey(t, rejected)
	require.Equal(t, 1, r.Attempts)
	require.Contains(t, r.LastError, "422")

	// The dispatcher keeps working (well past several backoffs) and never
	// calls the failed effect again.
	probe := b.record(t, "probe", 1)[0]
	require.Eventually(t, func() bool { return b.rowByKey(t, probe).State == sideeffect.StateConfirmed }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, 1, rc.callsOf(rejected), "a definite error is not retried")
	require.Equal(t, sideeffect.StateFailed, b.rowByKey(t, rejected).State)
}

func TestRetryAfterIsHonoured(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t)
	rc.setHook(func(w http.ResponseWriter, r *http.Request, key string, n int) bool {
		if n == 1 {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return true
		}
		return false
	})
	keys := b.record(t, "busy", 1)
	start(t, b, map[string]sideeffect.Provider{"busy": hook(rc, nil)}, fastConfig(b)) // backoff would be 10ms
	b.waitState(t, sideeffect.StateConfirmed, 1, 10*time.Second)
	rc.check(t, keys)
	rc.mu.Lock()
	times := rc.times[keys[0]]
	rc.mu.Unlock()
	require.Len(t, times, 2)
	require.GreaterOrEqual(t, times[1].Sub(times[0]), 950*time.Millisecond, "retried before Retry-After")
	require.Equal(t, 2, b.rowByKey(t, keys[0]).Attempts)
}

func TestIndefiniteWithoutKeysBecomesUnknown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t)
	rc.setHook(func(w http.ResponseWriter, r *http.Request, key string, n int) bool {
		http.Error(w, "oops", http.StatusBadGateway)
		return true
	})
	keys := b.record(t, "sms", 1)
	start(t, b, map[string]sideeffect.Provider{"sms": hook(rc, &webhook.Config{KeysIgnored: true})}, fastConfig(b))
	b.waitState(t, sideeffect.StateUnknown, 1, 10*time.Second)
	require.Equal(t, 1, rc.callsOf(keys[0]), "a provider that ignores keys is never called twice blindly")
}

func TestMaxAttemptsEndsUnknown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t)
	rc.setHook(func(w http.ResponseWriter, r *http.Request, key string, n int) bool {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return true
	})
	keys := b.record(t, "down", 1)
	cfg := fastConfig(b)
	cfg.MaxAttempts = 3
	start(t, b, map[string]sideeffect.Provider{"down": hook(rc, nil)}, cfg)
	b.waitState(t, sideeffect.StateUnknown, 1, 10*time.Second)
	require.Equal(t, 3, rc.callsOf(keys[0]))
	require.Contains(t, b.rowByKey(t, keys[0]).LastError, "gave up after 3 attempts")
}

// lookupProvider does not honour keys but can tell whether it acted.
type lookupProvider struct {
	sideeffect.Provider
	acted func(key string) bool
}

func (lookupProvider) HonoursKeys() bool { return false }
func (p lookupProvider) Lookup(_ context.Context, key string) (string, bool, error) {
	if p.acted(key) {
		return "looked-up", true, nil
	}
	return "", false, nil
}

func TestExpiredLeaseIsReconciledThroughLookup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t)
	keys := b.record(t, "pay", 2)
	ctx := context.Background()
	// A dispatcher that died mid-call: keys[0] reached the provider (it
	// acted), keys[1] did not. Both rows are fired with an expired lease.
	rc.record(keys[0])
	_, err := b.db.Pool.Exec(ctx, `UPDATE side_effects SET state = 'fired', attempts = 1, fired_at = now(),
		lease_owner = 'dead', lease_expires_at = now() - interval '1 second', next_attempt_at = now() - interval '1 second'`)
	require.NoError(t, err)
	p := lookupProvider{Provider: hook(rc, nil), acted: func(k string) bool {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		return rc.effects[k] == 1
	}}
	start(t, b, map[string]sideeffect.Provider{"pay": p}, fastConfig(b))
	b.waitState(t, sideeffect.StateConfirmed, 2, 10*time.Second)
	rc.check(t, keys)
	require.Equal(t, 0, rc.callsOf(keys[0]), "found by lookup: not called again")
	require.Equal(t, "looked-up", b.rowByKey(t, keys[0]).ProviderRef)
	require.Equal(t, 1, rc.callsOf(keys[1]), "not found: fired again with the same key")
	require.Equal(t, 2, b.rowByKey(t, keys[1]).Attempts)
}

func TestExpiredLeaseRefiresWithSameKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t)
	keys := b.record(t, "mail", 1)
	rc.record(keys[0]) // the dead dispatcher's call got through
	_, err := b.db.Pool.Exec(context.Background(), `UPDATE side_effects SET state = 'fired', attempts = 1, fired_at = now(),
		lease_owner = 'dead', lease_expires_at = now() - interval '1 second', next_attempt_at = now() - interval '1 second'`)
	require.NoError(t, err)
	start(t, b, map[string]sideeffect.Provider{"mail": hook(rc, nil)}, fastConfig(b))
	b.waitState(t, sideeffect.StateConfirmed, 1, 10*time.Second)
	rc.check(t, keys)
	require.Equal(t, 2, b.rowByKey(t, keys[0]).Attempts)
}

// boundedProvider bounds its calls itself and records the deadline each
// call's context carries.
type boundedProvider struct {
	bound time.Duration
	left  chan time.Duration
}

func (p *boundedProvider) CallBound() time.Duration { return p.bound }

func (p *boundedProvider) Call(ctx context.Context, _ sideeffect.Call) (string, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		p.left <- -1
	} else {
		p.left <- time.Until(dl)
	}
	return "r", nil
}

// A provider bounding its own calls (sideeffect.Bounded) gets that bound as
// its context's deadline when it is shorter than CallTimeout, so it needs no
// timer of its own; a longer bound leaves CallTimeout in force.
func TestCallDeadlineIsTheShorterBound(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		bound, atMost, atLeast time.Duration
	}{
		{bound: 800 * time.Millisecond, atMost: 800 * time.Millisecond, atLeast: 100 * time.Millisecond},
		{bound: time.Minute, atMost: 5 * time.Second, atLeast: 4 * time.Second}, // CallTimeout is 5 s
	} {
		b := setup(t)
		b.record(t, "order.paid", 1)
		p := &boundedProvider{bound: c.bound, left: make(chan time.Duration, 1)}
		start(t, b, map[string]sideeffect.Provider{"order.paid": p}, fastConfig(b))
		left := <-p.left
		require.LessOrEqual(t, left, c.atMost, "bound %s", c.bound)
		require.GreaterOrEqual(t, left, c.atLeast, "bound %s", c.bound)
		b.waitState(t, sideeffect.StateConfirmed, 1, 10*time.Second)
	}
}
