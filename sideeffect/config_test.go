package sideeffect

import (
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
	_, err := New(&Config{Schema: "Bad-Name"})
	cfgerrtest.RequireField(t, err, ErrInvalidConfig, "sideeffect: Config.Schema", "")
}

func TestDispatcherConfigValidate(t *testing.T) {
	t.Parallel()
	dc := (*DispatcherConfig)(nil).withDefaults()
	require.NoError(t, dc.validate())
	require.Equal(t, time.Minute, dc.RetentionInterval)
	require.Equal(t, 1000, dc.RetentionBatch)
	require.Equal(t, retention.DefaultRate, dc.RetentionRate)
	for _, tc := range []struct {
		field  string
		cfg    DispatcherConfig
		detail string // what follows the field in the error, when pinned
	}{
		{"ID", DispatcherConfig{ID: "d\xff"}, "not valid UTF-8"},
		{"Concurrency", DispatcherConfig{Concurrency: -1}, "-1 is negative"},
		{"BatchSize", DispatcherConfig{BatchSize: -1}, "-1 is negative"},
		{"FlushSize", DispatcherConfig{FlushSize: -1}, "-1 is negative"},
		{"MaxAttempts", DispatcherConfig{MaxAttempts: -1}, "-1 is negative"},
		{"RetentionBatch", DispatcherConfig{RetentionBatch: -1}, "-1 is negative"},
		{"PollInterval", DispatcherConfig{PollInterval: -1}, "-1ns is negative"},
		{"CallTimeout", DispatcherConfig{CallTimeout: -1}, "-1ns is negative"},
		{"Lease", DispatcherConfig{Lease: -1}, "-1ns is negative"},
		{"Lease", DispatcherConfig{CallTimeout: time.Minute, Lease: time.Second}, "1s must exceed CallTimeout (1m0s), or a slow call could be fired twice at once"},
		{"RecoverInterval", DispatcherConfig{RecoverInterval: -1}, "-1ns is negative"},
		{"MinBackoff", DispatcherConfig{MinBackoff: -1}, "-1ns is negative"},
		{"MaxBackoff", DispatcherConfig{MaxBackoff: -1}, "-1ns is negative"},
		{"MaxBackoff", DispatcherConfig{MinBackoff: time.Minute, MaxBackoff: time.Second}, "1s is below MinBackoff (1m0s)"},
		{"MaxRetryAfter", DispatcherConfig{MaxRetryAfter: -1}, "-1ns is negative"},
		{"RetentionInterval", DispatcherConfig{RetentionInterval: -1}, "-1ns is negative"},
	} {
		c := tc.cfg.withDefaults()
		cfgerrtest.RequireField(t, c.validate(), ErrInvalidConfig, "sideeffect: DispatcherConfig."+tc.field, tc.detail)
		_, err := NewDispatcher(nil, nil, nil, &tc.cfg)
		require.ErrorIs(t, err, ErrInvalidConfig)
	}
}
