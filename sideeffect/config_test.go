package sideeffect

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
	_, err := New(&Config{Schema: "Bad-Name"})
	require.True(t, errors.Is(err, ErrInvalidConfig), "%v", err)
	require.True(t, strings.HasPrefix(err.Error(), "sideeffect: Config.Schema: "), "%v", err)
}

func TestDispatcherConfigValidate(t *testing.T) {
	t.Parallel()
	dc := (*DispatcherConfig)(nil).withDefaults()
	require.NoError(t, dc.validate())
	for _, tc := range []struct {
		field string
		cfg   DispatcherConfig
	}{
		{"Schema", DispatcherConfig{Schema: "Bad-Name"}},
		{"Concurrency", DispatcherConfig{Concurrency: -1}},
		{"BatchSize", DispatcherConfig{BatchSize: -1}},
		{"FlushSize", DispatcherConfig{FlushSize: -1}},
		{"MaxAttempts", DispatcherConfig{MaxAttempts: -1}},
		{"RetentionBatch", DispatcherConfig{RetentionBatch: -1}},
		{"PollInterval", DispatcherConfig{PollInterval: -1}},
		{"CallTimeout", DispatcherConfig{CallTimeout: -1}},
		{"Lease", DispatcherConfig{Lease: -1}},
		{"Lease", DispatcherConfig{CallTimeout: time.Minute, Lease: time.Second}},
		{"RecoverInterval", DispatcherConfig{RecoverInterval: -1}},
		{"MinBackoff", DispatcherConfig{MinBackoff: -1}},
		{"MaxBackoff", DispatcherConfig{MaxBackoff: -1}},
		{"MaxBackoff", DispatcherConfig{MinBackoff: time.Minute, MaxBackoff: time.Second}},
		{"MaxRetryAfter", DispatcherConfig{MaxRetryAfter: -1}},
		{"RetentionInterval", DispatcherConfig{RetentionInterval: -1}},
	} {
		c := tc.cfg.withDefaults()
		err := c.validate()
		require.Error(t, err, "%+v", tc.cfg)
		require.True(t, errors.Is(err, ErrInvalidConfig), "%v", err)
		require.True(t, strings.HasPrefix(err.Error(), "sideeffect: DispatcherConfig."+tc.field+": "), "%v", err)
		_, err = NewDispatcher(nil, nil, &tc.cfg)
		require.ErrorIs(t, err, ErrInvalidConfig)
	}
}
