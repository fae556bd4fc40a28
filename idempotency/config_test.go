package idempotency

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	c := (*Config)(nil).withDefaults()
	require.NoError(t, c.validate())
	for _, tc := range []struct {
		field string
		cfg   Config
	}{
		{"Schema", Config{Schema: "Bad-Name"}},
		{"RetentionInterval", Config{RetentionInterval: -1}},
		{"RetentionBatch", Config{RetentionBatch: -1}},
	} {
		c := tc.cfg.withDefaults()
		err := c.validate()
		require.Error(t, err, "%+v", tc.cfg)
		require.True(t, errors.Is(err, ErrInvalidConfig), "%v", err)
		require.True(t, strings.HasPrefix(err.Error(), "idempotency: Config."+tc.field+": "), "%v", err)
	}
}

func TestRouteValidate(t *testing.T) {
	t.Parallel()
	rc := (&Route{Operation: "op"}).withDefaults()
	require.NoError(t, rc.validate())
	for _, tc := range []struct {
		field string
		r     Route
	}{
		{"Operation", Route{}},
		{"Mode", Route{Operation: "op", Mode: 7}},
		{"TTL", Route{Operation: "op", TTL: -1}},
		{"MaxBodyBytes", Route{Operation: "op", MaxBodyBytes: -1}},
		{"Wait", Route{Operation: "op", Wait: -1}},
		{"RetryAfter", Route{Operation: "op", RetryAfter: -1}},
		{"Lease", Route{Operation: "op", Lease: time.Millisecond}},
	} {
		rc := tc.r.withDefaults()
		err := rc.validate()
		require.Error(t, err, "%+v", tc.r)
		require.True(t, errors.Is(err, ErrInvalidConfig), "%v", err)
		require.True(t, strings.HasPrefix(err.Error(), "idempotency: Route."+tc.field+": "), "%v", err)
		_, err = (&Edge{}).Route(&tc.r)
		require.ErrorIs(t, err, ErrInvalidConfig)
	}
}

// New's arguments are checked as its Config is: a nil db wraps
// ErrInvalidConfig.
func TestNewRejectsANilDB(t *testing.T) {
	t.Parallel()
	_, err := New(nil, nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
}
