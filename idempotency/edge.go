package idempotency

import (
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/pgsql"
)

// Edge is the HTTP idempotency layer: it builds one middleware per route and
// runs the retention loop (Prune). It is safe for concurrent use.
type Edge struct {
	db  oncekit.Pool
	cfg Config
	sql statements
	log *slog.Logger
	m   *metrics
	// watch makes the store's statements that cannot succeed as sent
	// errors, counted and reported by Healthy.
	watch *pgsql.Watch
	// syncStandbys says whether a stored response must be on the
	// synchronous standbys before it is replayed (see replicated).
	syncStandbys pgsql.SyncStandbys

	mu sync.Mutex
	// routes holds the first route built for each operation (defaults
	// set), from which StatusHandler derives its scope.
	routes map[string]*Route
}

// New returns an Edge storing records in db (normally a *pgxpool.Pool).
func New(db oncekit.Pool, cfg *Config) (*Edge, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db is nil", ErrInvalidConfig)
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(c.Registerer)
	if err != nil {
		return nil, err
	}
	return &Edge{db: db, cfg: c, sql: renderStatements(c.Schema), log: c.Logger, m: m, routes: map[string]*Route{},
		watch: pgsql.NewWatch(c.Logger, func(statement, class string) {
			m.statementErrors.WithLabelValues(statement, class).Inc()
		})}, nil
}

// Healthy reports nil unless the edge's claim of a key (the statement
// every request runs first) is failing in a way that sending it again
// cannot cure: a missing grant on the edge's tables, a table or column
// that is not there, a read-only server. The error names the statement,
// since when it fails and PostgreSQL's answer; it wraps
// oncekit.ErrStatementBroken. Meanwhile each request is answered 503
// (store_unavailable) and nothing runs; each distinct cause is logged at
// error level once a minute, not per request, and counted in
// oncekit_idempotency_statement_errors_total. Healthy turns nil again at
// the next request whose claim succeeds.
func (e *Edge) Healthy(context.Context) error { return e.watch.Err() }

// route is one configured route.
type route struct {
	e   *Edge
	cfg Route
	// lockTimeout bounds how long a SameTx claim waits for a concurrent
	// holder of the same key; patientLockTimeout, the claim made again after
	// a wait for another lock timed out.
	lockTimeout, patientLockTimeout string

	keys *keyLimiter // new keys per scope (NewKeysPerMinute); nil: no limit

	mu      sync.Mutex
	waiting map[recordID]int // requests waiting (Waiting.For) on each in-progress key
}

// overKeyLimit reports whether a newly claimed key (its token 1: not a
// takeover) is one too many for its scope, and answers 429 if so; the
// caller then drops the claim.
func (rt *route) overKeyLimit(w http.ResponseWriter, id recordID, token int64) bool {
	if token != 1 {
		return false
	}
	ok, after := rt.keys.allow(id.tenant, time.Now())
	if ok {
		return false
	}
	rt.count(OutcomeRateLimited)
	writeProblem(w, http.StatusTooManyRequests, CodeKeyFlood,
		"this caller creates new Idempotency-Keys faster than the operation allows; retry later", max(int((after+time.Second-1)/time.Second), 1))
	return true
}

// startWaiting takes one of the key's Waiting.MaxWaiters places to wait on
// it; false when they are all taken (the request answers 409 at once).
func (rt *route) startWaiting(id recordID) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.waiting[id] >= rt.cfg.Waiting.MaxWaiters {
		return false
	}
	rt.waiting[id]++
	return true
}

// stopWaiting gives back the place startWaiting took.
func (rt *route) stopWaiting(id recordID) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.waiting[id]--; rt.waiting[id] <= 0 {
		delete(rt.waiting, id)
	}
}

// otherLockWait is the least a SameTx claim waits, on its second try, after
// its first timed out on another lock than the key's row.
const otherLockWait = time.Second

// Route returns the middleware for one route. It wraps any http.Handler, so it
// fits the standard mux, chi and gorilla alike:
//
//	mw, err := edge.Route(&idempotency.Route{Operation: "create-payment", Mode: idempotency.SameTx,
//		Tenant: func(r *http.Request) (string, error) { return accountFrom(r.Context()) }})
//	mux.Handle("POST /payments", authenticate(mw(createPayment)))
//
// The middleware goes inside your authentication (authenticate above, which
// puts the caller in the context accountFrom reads): a replay is answered
// before the wrapped handler runs.
func (e *Edge) Route(r *Route) (func(http.Handler) http.Handler, error) {
	if r != nil && r.SharedScope && r.Tenant != nil {
		return nil, fmt.Errorf("%w: idempotency: Route.SharedScope: set together with Tenant; choose one", ErrInvalidConfig)
	}
	rc := r.withDefaults()
	if err := rc.validate(); err != nil {
		return nil, err
	}
	e.mu.Lock()
	if e.routes[rc.Operation] == nil {
		e.routes[rc.Operation] = &rc
	}
	e.mu.Unlock()
	// In SameTx mode the first request's claim is an uncommitted row: a
	// concurrent request gives up on its lock after 1 ms, and a request that
	// waits (Waiting) tries again later, holding no connection meanwhile. A
	// claim that timed out on another lock than a row's tries again waiting
	// a second.
	rt := &route{e: e, cfg: rc, waiting: map[recordID]int{}, keys: newKeyLimiter(rc.NewKeysPerMinute),
		lockTimeout:        "SET LOCAL lock_timeout = 1",
		patientLockTimeout: fmt.Sprintf("SET LOCAL lock_timeout = %d", otherLockWait.Milliseconds()),
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) { rt.serve(next, w, req) })
	}, nil
}

// errNoScope is a Tenant's empty answer: no authenticated caller.
var errNoScope = errors.New("idempotency: no scope for the request")

// keyHash is how keys appear in logs: derived from the stored digest, so
// that a record addressed by its digest (the status resource) logs the
// same hash as its requests.
func keyHash(id recordID) string { return digestHash(id.tenant, id.operation, id.stored()) }

// digestHash is keyHash of the record whose key's digest is stored.
func digestHash(tenant, operation, stored string) string {
	return oncekit.DeriveKey("idempotency.log", tenant, operation, stored)[:16]
}

func (rt *route) count(outcome string) {
	rt.e.m.requests.WithLabelValues(rt.cfg.Operation, outcome).Inc()
}

type statusCoder interface{ StatusCode() int }

func (rt *route) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	values := r.Header.Values(HeaderKey)
	if len(values) == 0 {
		if rt.cfg.Optional {
			rt.count(OutcomeBypass)
			next.ServeHTTP(w, r)
			return
		}
		rt.count(OutcomeMissingKey)
		writeProblem(w, http.StatusBadRequest, CodeMissingKey, "this operation requires an Idempotency-Key header", 0)
		return
	}
	if len(values) > 1 {
		rt.count(OutcomeInvalidKey)
		writeProblem(w, http.StatusBadRequest, CodeInvalidKey, "more than one Idempotency-Key header", 0)
		return
	}
	key, err := ParseKey(values[0])
	if err != nil {
		rt.count(OutcomeInvalidKey)
		writeProblem(w, http.StatusBadRequest, CodeInvalidKey, err.Error(), 0)
		return
	}
	tenant, err := rt.cfg.Tenant(r)
	if err == nil && tenant == "" && !rt.cfg.SharedScope {
		err = errNoScope
	}
	if err != nil {
		rt.count(OutcomeRejected)
		status := http.StatusForbidden
		var sc statusCoder
		if errors.As(err, &sc) && sc.StatusCode() >= 400 {
			status = sc.StatusCode()
		}
		writeProblem(w, status, CodeScopeRejected, "", 0)
		return
	}
	if !rt.homing(w, r, tenant) {
		return
	}
	body, err := readBody(r, rt.cfg.MaxBodyBytes)
	if err != nil {
		rt.count(OutcomeRejected)
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeProblem(w, http.StatusRequestEntityTooLarge, CodeBodyTooLarge,
				fmt.Sprintf("the body exceeds %d bytes", rt.cfg.MaxBodyBytes), 0)
			return
		}
		writeProblem(w, http.StatusBadRequest, CodeBodyUnreadable, "the body could not be read", 0)
		return
	}
	fp, ok := rt.fingerprint(w, r, body)
	if !ok {
		return
	}
	business, ok := rt.businessKeyOf(w, r, body)
	if !ok {
		return
	}
	id := recordID{tenant: tenant, operation: rt.cfg.Operation, key: key, business: business}
	if rt.cfg.Mode == SameTx {
		rt.serveSameTx(next, w, r, id, fp)
		return
	}
	rt.serveSeparate(next, w, r, id, fp)
}

// fingerprint returns the request's fingerprint: of its body, or of the
// validated command Route.Command returns, answering 400 (and reporting
// false) when Command refuses the request.
func (rt *route) fingerprint(w http.ResponseWriter, r *http.Request, body []byte) ([]byte, bool) {
	if rt.cfg.Command == nil {
		return Fingerprint(r.Method, rt.cfg.Operation, r.URL.RequestURI(), r.Header.Get("Content-Type"), body), true
	}
	cmd, err := rt.cfg.Command(r, body)
	if err != nil {
		rt.count(OutcomeRejected)
		writeProblem(w, http.StatusBadRequest, CodeBodyInvalid, err.Error(), 0)
		return nil, false
	}
	return Fingerprint(r.Method, rt.cfg.Operation, r.URL.RequestURI(), "application/json", cmd), true
}

// readBody reads at most limit bytes of the body and puts a re-readable copy
// back on the request for the handler.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, limit))
	_ = r.Body.Close()
	if err != nil {
		return nil, err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	return body, nil
}

// answerExisting answers from a record that holds the key: replay, 422 or
// 409. It reports false when the record is in progress and the route waits,
// so the caller should look again.
func (rt *route) answerExisting(w http.ResponseWriter, id recordID, fp []byte, rec *record, waitMore bool) bool {
	if subtle.ConstantTimeCompare(rec.fingerprint, fp) != 1 {
		rt.count(OutcomeMismatch)
		rt.e.log.Info("idempotency: key reused with a different request",
			"operation", id.operation, "key_hash", keyHash(id), "state", rec.state)
		writeProblem(w, http.StatusUnprocessableEntity, CodeKeyReused,
			"this Idempotency-Key was used with a different request; use a new key for a new request", 0)
		return true
	}
	if rec.bodyExpired {
		rt.count(OutcomeExpired)
		writeProblem(w, http.StatusUnprocessableEntity, CodeKeyExpired,
			"the request under this Idempotency-Key ran, and its response is no longer kept; use a new key for a new request", 0)
		return true
	}
	if rec.state == StateUnknown {
		rt.answerUnknown(w, id)
		return true
	}
	if rec.state == StateInProgress {
		rt.e.m.conflictAge.WithLabelValues(id.operation).Observe(rec.age.Seconds())
		if waitMore {
			return false
		}
		rt.inProgress(w)
		return true
	}
	body := rec.body
	if rec.sealed {
		var opened []byte
		err := errors.New("no Sealer configured")
		if rt.e.cfg.Sealer != nil {
			opened, err = rt.e.cfg.Sealer.Open(body, id.aad())
		}
		if err != nil {
			rt.storeFailed(w, id, fmt.Errorf("open sealed body: %w", err))
			return true
		}
		body = opened
	}
	rt.replayStored(w, rec, body, OutcomeReplayed)
	return true
}

// StoredResponse is a stored response, as ResponseVersions.Upgrade receives
// it.
type StoredResponse struct {
	StatusCode int
	Header     http.Header
	Body       []byte
}

// replayStored replays a completed record's response (body, opened),
// through ResponseVersions.Upgrade when it was stored under an older
// version, and counts outcome.
func (rt *route) replayStored(w http.ResponseWriter, rec *record, body []byte, outcome string) {
	if v := rt.cfg.ResponseVersions; v != nil && v.Upgrade != nil && rec.version < v.Current {
		resp := &StoredResponse{StatusCode: rec.status, Header: rec.headers.Clone(), Body: body}
		if resp.Header == nil {
			resp.Header = http.Header{}
		}
		if err := v.Upgrade(resp, rec.version); err != nil {
			rt.count(OutcomeOutdated)
			location := rec.headers.Get("Location")
			if location != "" {
				w.Header().Set("Link", "<"+location+`>; rel="related"`)
			}
			writeProblemAt(w, http.StatusUnprocessableEntity, CodeResponseOutdated,
				"the request under this Idempotency-Key ran; its stored response is of a shape this service no longer serves", location, 0)
			return
		}
		upgraded := *rec
		upgraded.status, upgraded.headers = resp.StatusCode, resp.Header
		rec, body = &upgraded, resp.Body
	}
	rt.count(outcome)
	replay(w, rec, body)
}

func (rt *route) retryAfterSeconds() int {
	return max(int((rt.cfg.RetryAfter+time.Second-1)/time.Second), 1)
}

// inProgress answers 409 for a key whose holder is still running.
func (rt *route) inProgress(w http.ResponseWriter) {
	rt.count(OutcomeConflictInProgress)
	writeProblem(w, http.StatusConflict, CodeInProgress,
		"a request with this Idempotency-Key is still being processed; retry later", rt.retryAfterSeconds())
}

// storeFailed answers 503 when the store cannot decide the request.
func (rt *route) storeFailed(w http.ResponseWriter, id recordID, err error) {
	rt.count(OutcomeError)
	if !rt.e.watch.Failed("store", err) { // else logged once per cause and minute
		rt.e.log.Error("idempotency: store failed", "operation", id.operation, "key_hash", keyHash(id), "error", err)
	}
	writeProblem(w, http.StatusServiceUnavailable, CodeStoreUnavailable,
		"the request's outcome could not be recorded; retry with the same key", rt.retryAfterSeconds())
}

// pollInterval is how often a waiting request looks at an in-progress record.
func (rt *route) pollInterval() time.Duration {
	return min(max(rt.cfg.waitFor()/20, 5*time.Millisecond), 100*time.Millisecond)
}

// encode prepares a recorded response for storage: allow-listed headers as
// JSON and the body, sealed when a Sealer is configured, nil when the route
// does not store bodies.
func (rt *route) encode(id recordID, rw *recorder) (headers, body []byte, sealed bool, err error) {
	if headers, err = rw.replayHeaders(rt.cfg.Responses.ReplayHeaders); err != nil {
		return nil, nil, false, err
	}
	if rt.cfg.Responses.NoStoreBody {
		return headers, []byte{}, false, nil
	}
	body = rw.body.Bytes()
	if rt.e.cfg.Sealer != nil {
		if body, err = rt.e.cfg.Sealer.Seal(body, id.aad()); err != nil {
			return nil, nil, false, fmt.Errorf("seal body: %w", err)
		}
		sealed = true
	}
	return headers, body, sealed, nil
}

// answerReleased finishes a request whose claim was released without a
// stored response: it counts the release, then re-raises the handler's
// panic or sends its answer.
func (rt *route) answerReleased(w http.ResponseWriter, id recordID, rw *recorder, panicked any) {
	rt.e.m.released.WithLabelValues(id.operation).Inc()
	if panicked != nil {
		panic(panicked)
	}
	rw.sendTo(w)
}

// runHandler runs next with a recorder; panicked is non-nil when it panicked.
func runHandler(next http.Handler, r *http.Request) (rw *recorder, panicked any) {
	rw = newRecorder()
	defer func() { panicked = recover() }()
	next.ServeHTTP(rw, r)
	return rw, nil
}
