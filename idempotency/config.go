package idempotency

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit/internal/cfgerr"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/retention"
)

// Sealer encrypts stored response bodies at rest. Seal and Open receive the
// record's identity (tenant, operation and key, length-prefixed) as
// additional authenticated data, so a sealed body cannot be moved to another
// record. Implementations must be safe for concurrent use.
type Sealer interface {
	Seal(plaintext, aad []byte) ([]byte, error)
	Open(ciphertext, aad []byte) ([]byte, error)
}

// Config configures an Edge. The zero value works.
type Config struct {
	// Schema holds the idempotency_keys table. Defaults to oncekit.DefaultSchema.
	Schema string
	// Logger receives the edge's logs; keys appear only as hashes. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// Registerer receives the edge's metrics. Nil means no metrics.
	Registerer prometheus.Registerer
	// Sealer, when set, encrypts every stored response body. Defaults to nil
	// (bodies stored as they are).
	Sealer Sealer
	// RetentionInterval is the period of the retention loop. Defaults to
	// oncekit.DefaultRetentionInterval.
	RetentionInterval time.Duration
	// RetentionBatch is the most rows one retention DELETE removes.
	// Defaults to oncekit.DefaultRetentionBatch.
	RetentionBatch int
	// RetentionRate is the most rows a retention pass deletes per second
	// (negative: no limit). Defaults to oncekit.DefaultRetentionRate.
	RetentionRate int
	// OnExpire, when set, is called by Prune for each completed or
	// released record whose response body reached its Route.TTL, and
	// again when the record reaches its Route.KeyTTL, before the body is
	// emptied or the record deleted: to archive it or write a tombstone,
	// as a retention policy may require. It receives the key's digest,
	// never the key. An error (or a panic) keeps the record as it is for
	// the next pass, and Prune then returns an error counting them; each
	// record is given to OnExpire once per pass, and a batch of
	// RetentionBatch records it fails entirely ends the pass. Records are
	// then let go one by one instead of in bulk, and a record whose
	// deletion fails after OnExpire returned is given to it again: at
	// least once. Defaults to nil: expired records are let go in bulk.
	OnExpire func(ctx context.Context, x Expired) error
}

// ErrInvalidConfig is wrapped by the error New and Edge.Route return
// for a bad Config or Route; the error's text names the field.
var ErrInvalidConfig = errors.New("idempotency: invalid config")

// withDefaults returns a copy of c (the zero Config if nil) with defaults set.
func (c *Config) withDefaults() Config {
	out := cfgerr.CopyOf(c)
	out.Schema = cmp.Or(out.Schema, pgsql.DefaultSchema)
	out.Logger = cmp.Or(out.Logger, slog.Default())
	retention.Defaults(&out.RetentionInterval, &out.RetentionBatch, &out.RetentionRate)
	return out
}

// validate returns an error naming the first bad field, wrapping
// ErrInvalidConfig.
func (c *Config) validate() error {
	bad := cfgerr.For(ErrInvalidConfig, "idempotency: Config")
	if _, err := pgsql.ValidateSchema(c.Schema); err != nil {
		return bad("Schema", "%w", err)
	}
	return bad.IfNegative(c, "RetentionInterval", "RetentionBatch")
}

// Mode selects how a route's claim relates to the handler's writes.
type Mode int

const (
	// Separate commits the claim before the handler runs and stores the
	// response after it. The handler may call external systems (through the
	// side-effect ledger); a claim whose owner died is recovered after its
	// lease by exactly one request, which re-runs the handler under a new
	// fencing token.
	Separate Mode = iota
	// SameTx runs the handler inside the claim's transaction (see Tx): its
	// rows, its outbox events and the stored response commit together, so a
	// crash at any point leaves nothing behind.
	SameTx
)

// String returns "separate" or "same-tx".
func (m Mode) String() string {
	if m == SameTx {
		return "same-tx"
	}
	return "separate"
}

// Route configures the middleware for one route (one operation). Its flat
// fields are what every route has, and two options of one setting each
// (Command, NewKeysPerMinute); every other opt-in feature is one pointer to
// a struct of its own (Waiting, Responses, UnknownOutcomes,
// ResponseVersions, BusinessKey, Homing), nil for the feature's default.
type Route struct {
	// Operation names what the route does, e.g. "create-payment". It scopes
	// keys (a key never matches across operations), enters the fingerprint and
	// labels metrics, so it must be a fixed, low-cardinality name. Required.
	Operation string
	// Mode is Separate (the default) or SameTx.
	Mode Mode
	// Optional lets requests without an Idempotency-Key through to the handler
	// untouched (it then gets no Info and, in SameTx mode, no Tx). Defaults to
	// false: the key is required.
	Optional bool
	// Tenant extracts the scope of a request from its authenticated caller
	// (an account or client ID from the principal your authentication put in
	// the request's context). Keys, stored responses and fingerprint
	// mismatches (422) are per scope: a caller never receives another's
	// response, nor learns that another's key is in use. The edge answers a
	// replay before the wrapped handler runs, so it must sit behind
	// authentication, never in front of it. An error answers 403 (or the
	// status of an error with a StatusCode() int method) and creates no
	// record; so does an empty scope. Required, unless SharedScope is set.
	Tenant func(*http.Request) (string, error)
	// SharedScope puts every request of the route in one scope instead of
	// scoping by Tenant: any caller that sends another caller's key and body
	// receives its stored response. Only for a route with a single caller
	// (one upstream service behind the same credentials). Defaults to false.
	SharedScope bool
	// TTL is how long a completed response is replayed. Defaults to 24 hours.
	TTL time.Duration
	// KeyTTL is how long the key's meaning (its fingerprint, status and
	// times) is kept, from its completion: after TTL, and until KeyTTL, a
	// retry under the key is refused with 422 IDEMPOTENCY_KEY_EXPIRED (the
	// operation ran; its response is no longer kept), or runs as new with
	// Responses.RunExpiredRetries; another body under it is still refused
	// as reused. The response itself is emptied at TTL. Defaults to
	// 7×TTL; at least TTL.
	KeyTTL time.Duration
	// MaxBodyBytes bounds the request body the middleware reads to fingerprint
	// it; a larger body answers 413 and creates no record. Defaults to 1 MiB.
	MaxBodyBytes int64
	// Lease is how long a Separate-mode claim stays owned without renewal;
	// the owner renews it every Lease/3 while its handler runs, so only a dead
	// owner's claim expires. Defaults to 30 seconds.
	Lease time.Duration
	// RetryAfter is the Retry-After sent with every answer that asks the
	// client to retry later under the same key: 409 in progress (when not
	// waiting, or after Waiting.For) and outcome unknown, 503 when the
	// store cannot be reached or the home region is unknown, and 502 when
	// the home region cannot be reached (Homing). Defaults to one second.
	RetryAfter time.Duration
	// Command, when set, returns the request's validated command (defaults
	// applied, unknown fields dropped, the API version included), which is
	// fingerprinted instead of the raw body, so that two spellings of one
	// command are one request and a deploy that changes defaults does not
	// turn honest retries into mismatches. JSON is fingerprinted in its
	// canonical form. An error answers 400 REQUEST_BODY_INVALID with the
	// error's text and creates no record. Defaults to nil: the raw body.
	Command func(r *http.Request, body []byte) ([]byte, error)
	// NewKeysPerMinute bounds the new keys one scope (Tenant) may create per
	// minute in this process, in bursts of as many: a request whose key
	// would be one too many answers 429 IDEMPOTENCY_KEY_RATE_LIMITED with
	// Retry-After, runs nothing and stores nothing. Retries of known keys
	// are never limited. Defaults to 0: no limit.
	NewKeysPerMinute int
	// Waiting, when set, makes a request that finds its key in progress
	// wait for the first request to finish and then replay its response
	// (see Waiting). Defaults to nil: such a request answers 409
	// IDEMPOTENCY_REQUEST_IN_PROGRESS at once, with RetryAfter.
	Waiting *Waiting
	// Responses, when set, says which of the handler's responses are
	// stored and replayed, what of them is kept, and what a retry gets
	// once its response expired (see Responses). Defaults to nil: every
	// response DefaultStore accepts is stored, rejections included, with
	// its body and DefaultReplayHeaders, and a retry after TTL is refused.
	Responses *Responses
	// UnknownOutcomes, when set, settles the requests whose outcome the
	// edge cannot prove (UnknownOutcomes.Reconcile) and links an unknown
	// answer to the route's status resource (UnknownOutcomes.StatusPath).
	// Defaults to nil: a dead owner's claim is recovered by running the
	// handler again, an unknown record waits for an operator
	// (Edge.Resolve), and an unknown answer links to no status resource.
	UnknownOutcomes *UnknownOutcomes
	// ResponseVersions, when set, versions the shape of the route's
	// responses across deploys (see ResponseVersions). Defaults to nil:
	// every response is stored as version 0 and replayed as it was stored.
	ResponseVersions *ResponseVersions
	// BusinessKey, when set, guards the operation by the client's own
	// identity of it as well as by its Idempotency-Key (see BusinessKey).
	// Defaults to nil.
	BusinessKey *BusinessKey
	// Homing, when set, gives each scope a home region where its keys are
	// claimed: a request that reaches another region is forwarded to its
	// home's edge or refused with 421 IDEMPOTENCY_WRONG_REGION before
	// anything is stored (see Homing). Defaults to nil: every request is
	// served in the region it reaches, and a retry landing in another
	// region than its first attempt runs again there unless the regions
	// share one store.
	Homing *Homing
}

// Waiting makes a request that finds its key in progress (another request
// with the same key runs) wait for the first one to finish, holding no
// connection, and then replay its response; a request still waiting after
// For answers 409 IDEMPOTENCY_REQUEST_IN_PROGRESS with the route's
// Retry-After.
type Waiting struct {
	// For is the longest a request waits. Required: a positive duration.
	For time.Duration
	// MaxWaiters bounds the requests of this process that wait on one
	// in-progress key at once; the others answer 409 with Retry-After at
	// once. Defaults to 4.
	MaxWaiters int
}

// waitFor is how long a request that finds its key in progress waits, 0
// for not at all.
func (r *Route) waitFor() time.Duration {
	if r.Waiting == nil {
		return 0
	}
	return r.Waiting.For
}

// Responses says which of a route's responses are stored and replayed to
// the retries under their key, and what of them: a response that is not
// stored releases the key (kept with the request's fingerprint), so that a
// retry with the same key and request runs again.
type Responses struct {
	// Store decides from the handler's status whether the response is
	// stored (and replayed) or the key released so a retry executes.
	// Defaults to DefaultStore.
	Store func(status int) bool
	// Rejections says, per problem code, whether a rejection the route
	// stores (an answer of 400 or more that Store accepts, whose JSON body
	// names the code in its "code" member, or "errorCode") is Binding,
	// stored and replayed to every retry under the key, or Released: not
	// stored, so that a retry with the same key and request runs again
	// once the state the rejection depended on changed, as a rejection
	// for insufficient funds may. Codes are 1 to MaxProblemCodeLen bytes
	// of letters, digits and "_-.:"; an answer whose code is missing or
	// malformed is Binding. Defaults to nil: every stored rejection is
	// Binding.
	Rejections map[string]Rejection
	// ReplayHeaders lists the response headers stored and replayed.
	// Defaults to DefaultReplayHeaders.
	ReplayHeaders []string
	// NoStoreBody stores status and headers but not the body, for
	// responses too sensitive to keep; a replay then has an empty body.
	// Defaults to false.
	NoStoreBody bool
	// RunExpiredRetries runs a retry whose response expired (after the
	// route's TTL, before its KeyTTL) as a new request instead of refusing
	// it with 422 IDEMPOTENCY_KEY_EXPIRED. Defaults to false.
	RunExpiredRetries bool
}

// UnknownOutcomes is what a route does with the requests whose outcome the
// edge cannot prove: a record its handler left unknown (Unknown), answered
// 409 IDEMPOTENCY_OUTCOME_UNKNOWN until it is settled, and a Separate-mode
// claim whose owner died (its lease ran out).
type UnknownOutcomes struct {
	// Reconcile, when set, decides what became of a request in doubt: a
	// claim whose owner died, or a record the handler left unknown. The
	// next request with the same key and body takes the claim over, as one
	// request, and calls Reconcile instead of the handler; its Verdict
	// settles the record (see Verdict). Separate mode only. Defaults to
	// nil: a dead owner's claim is recovered by running the handler again,
	// and an unknown record waits for an operator (Edge.Resolve).
	Reconcile func(w http.ResponseWriter, r *http.Request, u InDoubt) Verdict
	// StatusPath is where the route's status resource
	// (Edge.StatusHandler(Operation)) is mounted, with "{digest}" standing
	// for the key's digest (StoredKey), never the key itself, for instance
	// "/idempotency/create-payment/{digest}": an unknown answer links to it.
	// A path with "{key}" is refused: it would put the raw key in every
	// access log, gateway log and trace the link passes through. Defaults
	// to "": no link.
	StatusPath string
}

// ResponseVersions versions the shape of a route's responses: each stored
// response carries the version it was stored under, and a replay of an
// older one goes through Upgrade.
type ResponseVersions struct {
	// Current is the version of the shape of the route's responses,
	// stored with each. Raise it when a deploy changes that shape.
	// Defaults to 0.
	Current int
	// Upgrade, when set, is called before replaying a response stored
	// under an older version (from): it may rewrite the response in place
	// to the current shape, or return an error to refuse the replay, which
	// answers 422 IDEMPOTENCY_RESPONSE_OUTDATED (linking the resource's
	// Location when the response had one). Defaults to nil: a response is
	// replayed as it was stored, whatever its version.
	Upgrade func(resp *StoredResponse, from int) error
}

// responseVersion is the version the route's responses are stored under.
func (r *Route) responseVersion() int {
	if r.ResponseVersions == nil {
		return 0
	}
	return r.ResponseVersions.Current
}

// BusinessKey guards an operation by the client's own identity of it (an
// account and a merchant reference, say): a request under a new
// Idempotency-Key whose business key an earlier operation holds does not
// run: it gets that operation's stored response when the two requests are
// the same, or 409 BUSINESS_KEY_REUSED (with the resource's Location as a
// Link) otherwise, and 409 in progress while the first one runs. The
// business key is kept (as a digest) for TTL, past the Idempotency-Key's
// own expiry, and freed when its request is released.
type BusinessKey struct {
	// Of returns the request's business key, "" for none. An error
	// answers 400 REQUEST_BODY_INVALID. Required.
	Of func(r *http.Request, body []byte) (string, error)
	// TTL is how long a business key is kept from its first use. Defaults
	// to 30 days, or the route's KeyTTL when that is longer; at least
	// KeyTTL.
	TTL time.Duration
	// Conflict answers a request reusing a business key with 409
	// BUSINESS_KEY_REUSED even when it is the same request as the first
	// operation's, instead of replaying that operation's response.
	// Defaults to false.
	Conflict bool
}

// DefaultReplayHeaders are the response headers replayed unless a Route says
// otherwise.
var DefaultReplayHeaders = []string{
	"Content-Type", "Content-Language", "Content-Location", "Location", "ETag", "Last-Modified",
	"Cache-Control", "Link", "Preference-Applied",
}

// DefaultStore stores every response except 5xx (a server failure: the
// retry should execute) and 401, 403, 408 and 429 (authentication,
// authorisation, timeout and rate limiting are not the operation's outcome).
func DefaultStore(status int) bool {
	switch {
	case status >= 500:
		return false
	case status == http.StatusUnauthorized, status == http.StatusForbidden,
		status == http.StatusRequestTimeout, status == http.StatusTooManyRequests:
		return false
	}
	return true
}

// withDefaults returns a copy of r (the zero Route if nil) with defaults set,
// Responses and UnknownOutcomes never nil (copies of the caller's), and
// Responses.ReplayHeaders in canonical form.
func (r *Route) withDefaults() Route {
	rc := cfgerr.CopyOf(r)
	if rc.SharedScope && rc.Tenant == nil {
		rc.Tenant = func(*http.Request) (string, error) { return "", nil }
	}
	rc.TTL = cmp.Or(rc.TTL, 24*time.Hour)
	rc.KeyTTL = cmp.Or(rc.KeyTTL, 7*rc.TTL)
	unknown := cfgerr.CopyOf(rc.UnknownOutcomes)
	rc.UnknownOutcomes = &unknown
	if rc.BusinessKey != nil {
		bk := *rc.BusinessKey
		bk.TTL = cmp.Or(bk.TTL, max(30*24*time.Hour, rc.KeyTTL))
		rc.BusinessKey = &bk
	}
	rc.MaxBodyBytes = cmp.Or(rc.MaxBodyBytes, 1<<20)
	rc.RetryAfter = cmp.Or(rc.RetryAfter, time.Second)
	if rc.Waiting != nil {
		waiting := *rc.Waiting
		waiting.MaxWaiters = cmp.Or(waiting.MaxWaiters, 4)
		rc.Waiting = &waiting
	}
	rc.Lease = cmp.Or(rc.Lease, 30*time.Second)
	responses := cfgerr.CopyOf(rc.Responses)
	if responses.ReplayHeaders == nil {
		responses.ReplayHeaders = DefaultReplayHeaders
	}
	if responses.Store == nil {
		responses.Store = DefaultStore
	}
	canon := make([]string, len(responses.ReplayHeaders))
	for i, h := range responses.ReplayHeaders {
		canon[i] = http.CanonicalHeaderKey(h)
	}
	responses.ReplayHeaders = canon
	rc.Responses = &responses
	return rc
}

// validate returns an error naming the first bad field, wrapping
// ErrInvalidConfig.
func (r *Route) validate() error {
	bad := cfgerr.For(ErrInvalidConfig, "idempotency: Route")
	switch {
	case r.Operation == "":
		return bad("Operation", "required")
	case r.Mode != Separate && r.Mode != SameTx:
		return bad("Mode", "unknown mode %d", r.Mode)
	case r.Tenant == nil:
		return bad("Tenant", "required: scope keys by the authenticated caller, or set SharedScope for a route with one caller")
	}
	if err := bad.IfNegative(r, "TTL", "KeyTTL", "MaxBodyBytes", "RetryAfter", "NewKeysPerMinute"); err != nil {
		return err
	}
	if w := r.Waiting; w != nil {
		if err := cfgerr.For(ErrInvalidConfig, "idempotency: Route.Waiting").IfNegative(w, "For", "MaxWaiters"); err != nil {
			return err
		}
		if w.For == 0 {
			return bad("Waiting.For", "required: how long a request waits for its key's first request")
		}
	}
	if r.responseVersion() < 0 {
		return bad("ResponseVersions.Current", "%d is negative", r.responseVersion())
	}
	if r.KeyTTL < r.TTL {
		return bad("KeyTTL", "%v is below TTL (%v)", r.KeyTTL, r.TTL)
	}
	if bk := r.BusinessKey; bk != nil {
		switch {
		case bk.Of == nil:
			return bad("BusinessKey.Of", "required")
		case bk.TTL < r.KeyTTL:
			return bad("BusinessKey.TTL", "%v is below KeyTTL (%v)", bk.TTL, r.KeyTTL)
		}
	}
	if u := r.UnknownOutcomes; u != nil {
		switch {
		case u.Reconcile != nil && r.Mode != Separate:
			return bad("UnknownOutcomes.Reconcile", "Separate mode only: a SameTx request's outcome commits with its response")
		case strings.Contains(u.StatusPath, "{key}"):
			return bad("UnknownOutcomes.StatusPath", "%q holds {key}: a raw key in a URL lands in access and gateway logs; address the record by its digest with {digest}", u.StatusPath)
		case u.StatusPath != "" && strings.Count(u.StatusPath, "{digest}") != 1:
			return bad("UnknownOutcomes.StatusPath", "%q must hold {digest} once", u.StatusPath)
		}
	}
	if r.Responses != nil {
		if err := validateRejections(r.Responses.Rejections); err != nil {
			return bad("Responses.Rejections", "%w", err)
		}
	}
	if r.Homing != nil {
		if err := r.Homing.validate(); err != nil {
			return bad("Homing", "%w", err)
		}
	}
	if r.Lease < 3*time.Millisecond {
		return bad("Lease", "%v is below 3ms", r.Lease)
	}
	return nil
}
