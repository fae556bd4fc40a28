package idempotency

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/cfgerr/cfgerrtest"
	"github.com/oncekit/oncekit/internal/retention"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	c := (*Config)(nil).withDefaults()
	require.NoError(t, c.validate())
	require.Equal(t, time.Minute, c.RetentionInterval)
	require.Equal(t, 1000, c.RetentionBatch)
	require.Equal(t, retention.DefaultRate, c.RetentionRate)
	for _, tc := range []struct {
		field  string
		cfg    Config
		detail string // what follows the field in the error, when pinned
	}{
		{"Schema", Config{Schema: "Bad-Name"}, ""},
		{"RetentionInterval", Config{RetentionInterval: -1}, "-1ns is negative"},
		{"RetentionBatch", Config{RetentionBatch: -1}, "-1 is negative"},
	} {
		c := tc.cfg.withDefaults()
		cfgerrtest.RequireField(t, c.validate(), ErrInvalidConfig, "idempotency: Config."+tc.field, tc.detail)
	}
}

func TestRouteValidate(t *testing.T) {
	t.Parallel()
	rc := (&Route{Operation: "op", SharedScope: true}).withDefaults()
	require.NoError(t, rc.validate())
	for _, tc := range []struct {
		field  string
		r      Route
		detail string // what follows the field in the error
	}{
		{"Operation", Route{}, "required"},
		{"Mode", Route{Operation: "op", SharedScope: true, Mode: 7}, "unknown mode 7"},
		{"TTL", Route{Operation: "op", SharedScope: true, TTL: -1}, "-1ns is negative"},
		{"KeyTTL", Route{Operation: "op", SharedScope: true, TTL: time.Hour, KeyTTL: time.Minute}, "1m0s is below TTL (1h0m0s)"},
		{"MaxBodyBytes", Route{Operation: "op", SharedScope: true, MaxBodyBytes: -1}, "-1 is negative"},
		{"Waiting.For", Route{Operation: "op", SharedScope: true, Waiting: &Waiting{For: -1}}, "-1ns is negative"},
		{"Waiting.For", Route{Operation: "op", SharedScope: true, Waiting: &Waiting{MaxWaiters: 8}}, "required: how long a request waits for its key's first request"},
		{"Waiting.MaxWaiters", Route{Operation: "op", SharedScope: true, Waiting: &Waiting{For: time.Second, MaxWaiters: -1}}, "-1 is negative"},
		{"RetryAfter", Route{Operation: "op", SharedScope: true, RetryAfter: -1}, "-1ns is negative"},
		{"Lease", Route{Operation: "op", SharedScope: true, Lease: time.Millisecond}, "1ms is below 3ms"},
		{"UnknownOutcomes.Reconcile", Route{Operation: "op", SharedScope: true, Mode: SameTx, UnknownOutcomes: &UnknownOutcomes{Reconcile: func(http.ResponseWriter, *http.Request, InDoubt) Verdict { return Settled }}}, "Separate mode only: a SameTx request's outcome commits with its response"},
		{"UnknownOutcomes.StatusPath", Route{Operation: "op", SharedScope: true, UnknownOutcomes: &UnknownOutcomes{StatusPath: "/status"}}, `"/status" must hold {digest} once`},
		{"Responses.Rejections", Route{Operation: "op", SharedScope: true, Responses: &Responses{Rejections: map[string]Rejection{"": Released}}}, ""},
		{"ResponseVersions.Current", Route{Operation: "op", SharedScope: true, ResponseVersions: &ResponseVersions{Current: -1}}, "-1 is negative"},
		{"BusinessKey.Of", Route{Operation: "op", SharedScope: true, BusinessKey: &BusinessKey{Conflict: true}}, "required"},
		{"BusinessKey.TTL", Route{Operation: "op", SharedScope: true, BusinessKey: &BusinessKey{Of: func(*http.Request, []byte) (string, error) { return "", nil }, TTL: time.Minute}}, "1m0s is below KeyTTL (168h0m0s)"},
		{"Tenant", Route{Operation: "op"}, "required: scope keys by the authenticated caller, or set SharedScope for a route with one caller"},
	} {
		rc := tc.r.withDefaults()
		cfgerrtest.RequireField(t, rc.validate(), ErrInvalidConfig, "idempotency: Route."+tc.field, tc.detail)
		_, err := (&Edge{}).Route(&tc.r)
		require.ErrorIs(t, err, ErrInvalidConfig)
	}
}

// A route's defaults fill its own copy of an opt-in struct, never the
// caller's, which may configure other routes.
func TestRouteDefaultsLeaveTheCallersStructs(t *testing.T) {
	t.Parallel()
	waiting := &Waiting{For: time.Second}
	responses := &Responses{ReplayHeaders: []string{"x-request-id"}}
	rc := (&Route{Operation: "op", SharedScope: true, Waiting: waiting, Responses: responses}).withDefaults()
	require.Equal(t, 4, rc.Waiting.MaxWaiters)
	require.Equal(t, Waiting{For: time.Second}, *waiting)
	require.Equal(t, []string{"X-Request-Id"}, rc.Responses.ReplayHeaders)
	require.NotNil(t, rc.Responses.Store)
	require.Equal(t, []string{"x-request-id"}, responses.ReplayHeaders)
	require.Nil(t, responses.Store)
}

// New's arguments are checked as its Config is: a nil db wraps
// ErrInvalidConfig.
func TestNewRejectsANilDB(t *testing.T) {
	t.Parallel()
	_, err := New(nil, nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
}
