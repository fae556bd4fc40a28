package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
)

const records = `SELECT count(*) FROM idempotency_keys`

// Case 1: a required route without a key answers 400 MISSING_IDEMPOTENCY_KEY
// and creates nothing.
func TestMissingKey(t *testing.T) {
	t.Parallel()
	h := newHarness(t, idempotency.Route{}, nil)
	resp := h.post(t, "acme", "", `{"amount":100}`)
	require.Equal(t, http.StatusBadRequest, resp.status)
	require.Equal(t, idempotency.CodeMissingKey, resp.problemCode(t))
	require.Zero(t, h.runs.Load())
	require.Zero(t, count(t, h.db, records))
}

// An optional route lets a request without a key through, unguarded.
func TestOptionalKey(t *testing.T) {
	t.Parallel()
	h := newHarness(t, idempotency.Route{Optional: true}, nil)
	// Without a key there is no Info: the handler answers 500 by design here.
	resp := h.post(t, "acme", "", `{"amount":100}`)
	require.Equal(t, http.StatusInternalServerError, resp.status)
	require.EqualValues(t, 1, h.runs.Load())
	require.Zero(t, count(t, h.db, records))
}

// Case 2: malformed keys answer 400 INVALID_IDEMPOTENCY_KEY.
func TestInvalidKey(t *testing.T) {
	t.Parallel()
	h := newHarness(t, idempotency.Route{}, nil)
	for _, key := range []string{
		strings.Repeat("k", 256),             // too long
		`"` + strings.Repeat("k", 256) + `"`, // too long, quoted
		`""`,                                 // empty
		"   ",                                // empty after trimming (sent as is)
		"ключ",                               // not ASCII
		`"a";p=1`,                            // parameters
		`two words`,                          // not a token
		"\"tab\there\"",                      // control character (HTAB, which HTTP lets through)
		"tab\there",                          // control character, unquoted
	} {
		resp := h.post(t, "acme", key, `{"amount":100}`)
		require.Equal(t, http.StatusBadRequest, resp.status, "%q", key)
		require.Equal(t, idempotency.CodeInvalidKey, resp.problemCode(t), "%q", key)
	}
	// An empty header value, other control characters and a repeated header
	// need a hand-written request: Go's client refuses to send them (and Go's
	// server answers 400 itself for control characters other than HTAB).
	for _, raw := range []string{"Idempotency-Key: \r\n", "Idempotency-Key: \"ab\x01cd\"\r\n", "Idempotency-Key: ab\x7fcd\r\n",
		"Idempotency-Key: a\r\nIdempotency-Key: b\r\n"} {
		status, body := rawPost(t, h.srv.URL, raw)
		t.Logf("%q -> %d %s", raw, status, body)
		require.Equal(t, http.StatusBadRequest, status, "%q", raw)
		if strings.Contains(body, "code") { // net/http itself may reject control characters first
			require.Contains(t, body, idempotency.CodeInvalidKey, "%q", raw)
		}
	}
	require.Zero(t, h.runs.Load())
	require.Zero(t, count(t, h.db, records))
}

// Case 3: the first request executes; the retry replays status, allow-listed
// headers and body byte for byte with Idempotent-Replayed: true; the handler
// ran once.
func TestReplay(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, idempotency.Route{Mode: mode}, nil)
			first := h.post(t, "acme", "pay-1", `{"amount":100}`)
			require.Equal(t, http.StatusCreated, first.status, first.body)
			require.Empty(t, first.header.Get(idempotency.HeaderReplayed))
			require.Equal(t, "1", first.header.Get("X-Not-Replayed"))

			for range 3 {
				again := h.post(t, "acme", "pay-1", `{"amount":100}`)
				require.Equal(t, first.status, again.status)
				require.Equal(t, first.body, again.body)
				for _, name := range []string{"Content-Type", "Location", "Etag", "Content-Length"} {
					require.Equal(t, first.header.Values(name), again.header.Values(name), name)
				}
				require.Equal(t, "true", again.header.Get(idempotency.HeaderReplayed))
				require.Empty(t, again.header.Get("X-Not-Replayed"), "header outside the allow-list replayed")
			}
			require.EqualValues(t, 1, h.runs.Load())
			require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM payments`))
			require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE state = 'completed' AND status_code = 201`))
		})
	}
}

// Case 4: reordered members and changed whitespace replay instead of
// mismatching.
func TestReplayReorderedBody(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, idempotency.Route{Mode: mode}, nil)
			first := h.post(t, "acme", "pay-1", `{"amount":100,"currency":"EUR","meta":{"a":1,"b":[1,2]}}`)
			require.Equal(t, http.StatusCreated, first.status, first.body)
			again := h.post(t, "acme", "pay-1", "{\n  \"meta\": {\"b\": [1, 2.0], \"a\": 1e0},\n  \"currency\" : \"\\u0045UR\",\n  \"amount\": 100\n}\n")
			require.Equal(t, http.StatusCreated, again.status, again.body)
			require.Equal(t, "true", again.header.Get(idempotency.HeaderReplayed))
			require.Equal(t, first.body, again.body)
			require.EqualValues(t, 1, h.runs.Load())
		})
	}
}

// Case 5: the same key with a different amount answers 422
// IDEMPOTENCY_KEY_REUSED, whether the first request completed or is still in
// progress.
func TestKeyReused(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run("completed/"+mode.String(), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, idempotency.Route{Mode: mode}, nil)
			require.Equal(t, http.StatusCreated, h.post(t, "acme", "pay-1", `{"amount":100}`).status)
			resp := h.post(t, "acme", "pay-1", `{"amount":999}`)
			require.Equal(t, http.StatusUnprocessableEntity, resp.status)
			require.Equal(t, idempotency.CodeKeyReused, resp.problemCode(t))
			require.EqualValues(t, 1, h.runs.Load())
		})
	}
	// In Separate mode the in_progress claim is committed, so a different
	// request under the same key is told apart at once. (In SameTx mode the
	// claim is not visible before it commits: a concurrent request waits and
	// answers 409, and 422 once the first has committed.)
	t.Run("in-progress/separate", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, idempotency.Route{Mode: idempotency.Separate}, nil)
		release := h.withGate()
		defer release()
		done := make(chan response, 1)
		go func() { done <- postInBackground(t, h.srv.URL+"/payments", "acme", "pay-1", `{"amount":100}`) }()
		<-h.inside
		resp := h.post(t, "acme", "pay-1", `{"amount":999}`)
		require.Equal(t, http.StatusUnprocessableEntity, resp.status)
		require.Equal(t, idempotency.CodeKeyReused, resp.problemCode(t))
		same := h.post(t, "acme", "pay-1", `{"amount":100}`)
		require.Equal(t, http.StatusConflict, same.status)
		require.Equal(t, idempotency.CodeInProgress, same.problemCode(t))
		release()
		require.Equal(t, http.StatusCreated, (<-done).status)
		require.EqualValues(t, 1, h.runs.Load())
	})
}

// Case 6: 50 concurrent requests with one key execute once; the others replay
// or answer 409 with Retry-After.
func TestConcurrentSameKey(t *testing.T) {
	t.Parallel()
	const n = 50
	for _, mode := range modes {
		for _, wait := range []time.Duration{0, 10 * time.Second} {
			t.Run(fmt.Sprintf("%s/wait=%s", mode, wait), func(t *testing.T) {
				t.Parallel()
				route := idempotency.Route{Mode: mode}
				if wait > 0 {
					route.Waiting = &idempotency.Waiting{For: wait, MaxWaiters: n}
				}
				h := newHarness(t, route, nil)
				var release func()
				if wait == 0 {
					// Hold the first execution until every other request has
					// answered, so they all really meet it in progress.
					release = h.withGate()
					defer release()
				}
				start := make(chan struct{})
				results := make(chan response, n)
				var wg sync.WaitGroup
				for range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						resp, err := tryPost(h.srv.URL+"/payments", "acme", "pay-1", `{"amount":100}`)
						if err != nil {
							resp = response{status: -1, body: err.Error()}
						}
						results <- resp
					}()
				}
				close(start)
				var got []response
				if release != nil {
					for len(got) < n-1 {
						got = append(got, <-results)
					}
					release()
				}
				wg.Wait()
				close(results)
				for r := range results {
					got = append(got, r)
				}
				created, replayed, conflicts := 0, 0, 0
				for _, r := range got {
					switch {
					case r.status == http.StatusCreated && r.header.Get(idempotency.HeaderReplayed) == "true":
						replayed++
					case r.status == http.StatusCreated:
						created++
					case r.status == http.StatusConflict:
						require.Equal(t, idempotency.CodeInProgress, r.problemCode(t))
						require.Equal(t, "1", r.header.Get("Retry-After"))
						conflicts++
					default:
						t.Fatalf("unexpected answer %d: %s", r.status, r.body)
					}
				}
				require.Equal(t, 1, created)
				require.Equal(t, n, created+replayed+conflicts)
				if wait > 0 {
					require.Equal(t, n-1, replayed, "with a wait (and room for every waiter) every other request replays")
				} else {
					require.Equal(t, n-1, conflicts, "without a wait every other request met it in progress")
				}
				require.EqualValues(t, 1, h.runs.Load())
				require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM payments`))
			})
		}
	}
}

// Case 7: a 503 is not stored; the retry executes and its 201 is stored. The
// same holds for 401, 403 and 429. The key is kept, released, with the
// request's fingerprint.
func TestServerErrorNotStored(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, idempotency.Route{Mode: mode}, nil)
			for i, status := range []int{http.StatusServiceUnavailable, http.StatusUnauthorized, http.StatusForbidden, http.StatusTooManyRequests} {
				h.status.Store(int64(status))
				resp := h.post(t, "acme", "pay-1", `{"amount":100}`)
				require.Equal(t, status, resp.status)
				require.Empty(t, resp.header.Get(idempotency.HeaderReplayed))
				require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE state = 'released' AND status_code IS NULL`),
					"a %d left the key released, without a response", status)
				require.EqualValues(t, i+1, h.runs.Load())
			}
			h.status.Store(0)
			resp := h.post(t, "acme", "pay-1", `{"amount":100}`)
			require.Equal(t, http.StatusCreated, resp.status)
			require.EqualValues(t, 5, h.runs.Load())
			again := h.post(t, "acme", "pay-1", `{"amount":100}`)
			require.Equal(t, "true", again.header.Get(idempotency.HeaderReplayed))
			require.Equal(t, resp.body, again.body)
			require.EqualValues(t, 5, h.runs.Load())
		})
	}
}

// Failures before the handler (tenant rejected, body too large) create no
// record either.
func TestRejectedBeforeHandler(t *testing.T) {
	t.Parallel()
	h := newHarness(t, idempotency.Route{MaxBodyBytes: 64}, nil)
	resp := h.post(t, "", "pay-1", `{"amount":100}`)
	require.Equal(t, http.StatusUnauthorized, resp.status)
	require.Equal(t, idempotency.CodeScopeRejected, resp.problemCode(t))
	resp = h.post(t, "acme", "pay-1", `{"amount":100,"note":"`+strings.Repeat("x", 100)+`"}`)
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.status)
	require.Equal(t, idempotency.CodeBodyTooLarge, resp.problemCode(t))
	require.Zero(t, h.runs.Load())
	require.Zero(t, count(t, h.db, records))
	// The key is still free.
	require.Equal(t, http.StatusCreated, h.post(t, "acme", "pay-1", `{"amount":100}`).status)
}

// Case 9: the same key in two tenants is two operations; no cross-tenant
// replay.
func TestTenantsAreIndependent(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, idempotency.Route{Mode: mode}, nil)
			a := h.post(t, "acme", "shared-key", `{"amount":100}`)
			b := h.post(t, "globex", "shared-key", `{"amount":100}`)
			require.Equal(t, http.StatusCreated, a.status)
			require.Equal(t, http.StatusCreated, b.status)
			require.Empty(t, b.header.Get(idempotency.HeaderReplayed))
			require.NotEqual(t, a.body, b.body)
			require.Contains(t, b.body, `"tenant":"globex"`)
			// A different amount in the other tenant is not a reuse either.
			c := h.post(t, "initech", "shared-key", `{"amount":5}`)
			require.Equal(t, http.StatusCreated, c.status)
			require.EqualValues(t, 3, h.runs.Load())
			ra := h.post(t, "acme", "shared-key", `{"amount":100}`)
			rb := h.post(t, "globex", "shared-key", `{"amount":100}`)
			require.Equal(t, a.body, ra.body)
			require.Equal(t, b.body, rb.body)
			require.EqualValues(t, 3, h.runs.Load())
			require.Equal(t, 3, count(t, h.db, `SELECT count(*) FROM payments`))
		})
	}
}

// A handler running longer than its lease keeps the claim (the lease is
// renewed), so a retry meanwhile answers 409 and never re-executes.
func TestLeaseRenewedWhileHandlerRuns(t *testing.T) {
	t.Parallel()
	// A lease long enough that a renewal delayed on a loaded machine does
	// not lapse it; the loop below still spans several leases.
	const lease = 500 * time.Millisecond
	h := newHarness(t, idempotency.Route{Mode: idempotency.Separate, Lease: lease}, nil)
	release := h.withGate()
	defer release()
	done := make(chan response, 1)
	go func() { done <- postInBackground(t, h.srv.URL+"/payments", "acme", "pay-1", `{"amount":100}`) }()
	<-h.inside
	claimedAt := time.Now()
	for time.Since(claimedAt) < 4*lease { // several leases long
		resp := h.post(t, "acme", "pay-1", `{"amount":100}`)
		require.Equal(t, http.StatusConflict, resp.status, resp.body)
	}
	release()
	require.Equal(t, http.StatusCreated, (<-done).status)
	require.EqualValues(t, 1, h.runs.Load())
	require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE token = 1 AND recoveries = 0`))
}

// A panicking handler releases the key: kept with its fingerprint, without
// a response.
func TestPanicReleasesKey(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, idempotency.Route{Mode: mode}, nil)
			mw, err := h.edge.Route(&idempotency.Route{Operation: "panics", Mode: mode, SharedScope: true})
			require.NoError(t, err)
			srv := newServer(t, mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) })))
			_, err = tryPost(srv+"/", "", "pay-1", `{}`)
			require.Error(t, err) // the connection is aborted
			require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE state = 'released'`))
		})
	}
}

func TestRouteValidation(t *testing.T) {
	t.Parallel()
	h := newHarness(t, idempotency.Route{}, nil)
	_, err := h.edge.Route(&idempotency.Route{})
	require.ErrorContains(t, err, "Route.Operation")
	_, err = h.edge.Route(&idempotency.Route{Operation: "x", TTL: -1, SharedScope: true})
	require.ErrorContains(t, err, "Route.TTL")
	_, err = idempotency.New(h.db.Pool, &idempotency.Config{Schema: "Bad-Name"})
	require.ErrorContains(t, err, "Config.Schema")
	_ = context.Background()
}

// With a Wait, a request that met the key in progress executes itself when
// the first request's 5xx released the key, instead of replaying.
func TestWaitersExecuteAfterRelease(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewRegistry()
			h := newHarness(t, idempotency.Route{Mode: mode, Waiting: &idempotency.Waiting{For: 10 * time.Second}}, &idempotency.Config{Registerer: reg})
			h.failRuns = 1
			release := h.withGate()
			defer release()
			first := make(chan response, 1)
			go func() { first <- postInBackground(t, h.srv.URL+"/payments", "acme", "pay-1", `{"amount":100}`) }()
			<-h.inside
			second := make(chan response, 1)
			go func() { second <- postInBackground(t, h.srv.URL+"/payments", "acme", "pay-1", `{"amount":100}`) }()
			require.Eventually(t, func() bool { // the second is waiting for the first
				if mode == idempotency.SameTx {
					return count(t, h.db, `SELECT count(*) FROM pg_stat_activity
						WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, h.db.Schema) == 1
				}
				return metricValue(t, reg, "oncekit_idempotency_in_progress_age_seconds") > 0
			}, 5*time.Second, 10*time.Millisecond)
			release()
			require.Equal(t, http.StatusServiceUnavailable, (<-first).status)
			got := <-second
			require.Equal(t, http.StatusCreated, got.status, got.body)
			require.Empty(t, got.header.Get(idempotency.HeaderReplayed))
			require.EqualValues(t, 2, h.runs.Load())
		})
	}
}

// A scope is always chosen: a route without Tenant is refused unless it
// opts into one shared scope, and a Tenant that finds no caller (an empty
// scope) answers 403 without a record, so unauthenticated requests never
// share a scope and replay each other's responses.
func TestScopeIsAlwaysChosen(t *testing.T) {
	t.Parallel()
	h := newHarness(t, idempotency.Route{}, nil)
	_, err := h.edge.Route(&idempotency.Route{Operation: "create-payment"})
	require.ErrorIs(t, err, idempotency.ErrInvalidConfig)
	require.ErrorContains(t, err, "Route.Tenant")
	_, err = h.edge.Route(&idempotency.Route{Operation: "create-payment", SharedScope: true, Tenant: tenantFromHeader})
	require.ErrorIs(t, err, idempotency.ErrInvalidConfig)

	mw, err := h.edge.Route(&idempotency.Route{Operation: "create-payment",
		Tenant: func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil }})
	require.NoError(t, err)
	srv := newServer(t, mw(http.HandlerFunc(h.createPayment(h.db.Pool))))
	resp := post(t, srv+"/", "", "k", `{"amount":100}`)
	require.Equal(t, http.StatusForbidden, resp.status)
	require.Zero(t, count(t, h.db, records))
	require.Equal(t, http.StatusCreated, post(t, srv+"/", "acme", "k", `{"amount":100}`).status)
}

// A key whose first request failed without a stored response keeps its
// meaning: another body under it is refused (422) and never executed, in
// either mode, while the same body runs again.
func TestReleasedKeyRefusesAnotherBody(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, idempotency.Route{Mode: mode}, nil)
			h.status.Store(http.StatusServiceUnavailable)
			require.Equal(t, http.StatusServiceUnavailable, h.post(t, "acme", "pay-1", `{"amount":100}`).status)
			h.status.Store(0)
			other := h.post(t, "acme", "pay-1", `{"amount":999}`)
			require.Equal(t, http.StatusUnprocessableEntity, other.status, "another body under a released key")
			require.Contains(t, other.body, idempotency.CodeKeyReused)
			require.EqualValues(t, 1, h.runs.Load(), "the other body never ran")
			require.Equal(t, http.StatusCreated, h.post(t, "acme", "pay-1", `{"amount":100}`).status, "the same body runs again")
			require.EqualValues(t, 2, h.runs.Load())
			require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM payments`))
		})
	}
}
