package sideeffect_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/sideeffect/webhook"
)

// testSecret signs the test webhooks.
const testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// receiver is a real HTTP server on loopback standing in for a provider:
// it verifies signatures, dedups effects by Idempotency-Key, counts calls
// per key and watches for two calls of one key at the same time.
type receiver struct {
	*httptest.Server
	t   testing.TB
	key []byte

	// hook, when set, may take over a call: n counts calls of this key
	// (from 1). It returns true when it answered.
	hook func(w http.ResponseWriter, r *http.Request, key string, n int) bool

	mu       sync.Mutex
	calls    map[string]int
	effects  map[string]int
	inflight map[string]int
	overlaps int
	bad      []string // protocol violations
	times    map[string][]time.Time
	arrived  chan string // every call's key, if set
}

func newReceiver(t testing.TB) *receiver {
	k, err := webhook.ParseSecret(testSecret)
	require.NoError(t, err)
	rc := &receiver{t: t, key: k, calls: map[string]int{}, effects: map[string]int{}, inflight: map[string]int{},
		times: map[string][]time.Time{}}
	rc.Server = httptest.NewServer(http.HandlerFunc(rc.serve))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	body := make([]byte, 0, 256)
	buf := make([]byte, 4096)
	for {
		n, err := r.Body.Read(buf)
		body = append(body, buf[:n]...)
		if err != nil {
			break
		}
	}
	key := r.Header.Get("Idempotency-Key")
	rc.mu.Lock()
	if key == "" || r.Header.Get("webhook-id") != key {
		rc.bad = append(rc.bad, "missing or mismatched key headers")
	}
	if err := webhook.Verify(rc.key, r.Header.Get("webhook-id"), r.Header.Get("webhook-timestamp"),
		r.Header.Get("webhook-signature"), body, 5*time.Minute, time.Now()); err != nil {
		rc.bad = append(rc.bad, "bad signature for "+key)
	}
	rc.calls[key]++
	n := rc.calls[key]
	rc.times[key] = append(rc.times[key], time.Now())
	rc.inflight[key]++
	if rc.inflight[key] > 1 {
		rc.overlaps++
	}
	hook := rc.hook
	rc.mu.Unlock()
	defer func() {
		rc.mu.Lock()
		rc.inflight[key]--
		rc.mu.Unlock()
	}()
	if rc.arrived != nil {
		rc.arrived <- key
	}
	if hook != nil && hook(w, r, key, n) {
		return
	}
	rc.act(w, key)
}

// setHook installs a per-call behaviour (see receiver.hook).
func (rc *receiver) setHook(h func(w http.ResponseWriter, r *http.Request, key string, n int) bool) {
	rc.mu.Lock()
	rc.hook = h
	rc.mu.Unlock()
}

// act performs the effect once per key and answers 200, marking replays.
func (rc *receiver) act(w http.ResponseWriter, key string) {
	rc.mu.Lock()
	rc.effects[key]++
	first := rc.effects[key] == 1
	if !first {
		rc.effects[key] = 1 // dedup: the effect happened once
	}
	rc.mu.Unlock()
	w.Header().Set("Webhook-Ref", "ref-"+key[:12])
	if !first {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(http.StatusOK)
}

// record applies the effect without answering (the provider acted, and the
// answer is lost).
func (rc *receiver) record(key string) {
	rc.mu.Lock()
	rc.effects[key] = 1
	rc.mu.Unlock()
}

func (rc *receiver) callsOf(key string) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.calls[key]
}

func (rc *receiver) totalCalls() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	n := 0
	for _, c := range rc.calls {
		n += c
	}
	return n
}

// check asserts the provider-side invariants: each key in keys acted on
// exactly once, every call carried good key headers and a valid signature,
// and no key was in two calls at once.
func (rc *receiver) check(t testing.TB, keys []string) {
	t.Helper()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	require.Empty(t, rc.bad)
	require.Zero(t, rc.overlaps, "a key was in two calls at the same time")
	for _, k := range keys {
		require.Equal(t, 1, rc.effects[k], "effects for key %s", k)
	}
	require.Len(t, rc.effects, len(keys), "effects for keys never recorded")
	known := make(map[string]bool, len(keys))
	for _, k := range keys {
		known[k] = true
	}
	for k := range rc.calls {
		require.True(t, known[k], "a call carried a key no effect has: %s", k)
	}
}

func (rc *receiver) String() string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return fmt.Sprintf("calls=%v effects=%v", rc.calls, rc.effects)
}

// waitCtx blocks until the client gives up on the request.
func waitCtx(ctx context.Context) { <-ctx.Done() }
