package outbox

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
		{"MaxPayload", Config{MaxPayload: -1}},
		{"Partitions", Config{Partitions: -1}},
		{"Partitions", Config{Partitions: maxPartitions + 1}},
	} {
		c := tc.cfg.withDefaults()
		err := c.validate()
		require.Error(t, err, "%+v", tc.cfg)
		require.True(t, errors.Is(err, ErrInvalidConfig), "%v", err)
		require.True(t, strings.HasPrefix(err.Error(), "outbox: Config."+tc.field+": "), "%v", err)
		_, err = New(&tc.cfg)
		require.ErrorIs(t, err, ErrInvalidConfig)
	}
}

func TestRelayConfigValidate(t *testing.T) {
	t.Parallel()
	rc := (*RelayConfig)(nil).withDefaults()
	require.NoError(t, rc.validate())
	for _, tc := range []struct {
		field string
		cfg   RelayConfig
	}{
		{"Schema", RelayConfig{Schema: "Bad-Name"}},
		{"Partitions", RelayConfig{Partitions: -1}},
		{"Partitions", RelayConfig{Partitions: maxPartitions + 1}},
		{"BatchSize", RelayConfig{BatchSize: -1}},
		{"LeaseTTL", RelayConfig{LeaseTTL: time.Millisecond}},
		{"PollInterval", RelayConfig{PollInterval: -1}},
		{"BusyPollInterval", RelayConfig{BusyPollInterval: -1}},
		{"BusyPollInterval", RelayConfig{PollInterval: time.Millisecond, BusyPollInterval: time.Second}},
		{"PublishTimeout", RelayConfig{PublishTimeout: -1}},
		{"MaxAttempts", RelayConfig{MaxAttempts: -1}},
		{"RetryInitial", RelayConfig{RetryInitial: -1}},
		{"RetryMax", RelayConfig{RetryInitial: time.Minute, RetryMax: time.Second}},
		{"BrokerBackoffMax", RelayConfig{BrokerBackoffMax: -1}},
		{"RetentionBatch", RelayConfig{RetentionBatch: -1}},
		{"RetentionInterval", RelayConfig{RetentionInterval: -1}},
		{"StatsInterval", RelayConfig{StatsInterval: -1}},
	} {
		c := tc.cfg.withDefaults()
		err := c.validate()
		require.Error(t, err, "%+v", tc.cfg)
		require.True(t, errors.Is(err, ErrInvalidConfig), "%v", err)
		require.True(t, strings.HasPrefix(err.Error(), "outbox: RelayConfig."+tc.field+": "), "%v", err)
	}
}

// NewRelay's arguments are checked as its Config is: a nil pool or
// publisher wraps ErrInvalidConfig.
func TestNewRelayRejectsNilArguments(t *testing.T) {
	t.Parallel()
	_, err := NewRelay(nil, nil, nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
}
