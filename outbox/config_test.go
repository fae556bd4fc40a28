package outbox

import (
	"strings"
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
	for _, tc := range []struct {
		field  string
		cfg    Config
		detail string // what follows the field in the error, when pinned
	}{
		{"Schema", Config{Schema: "Bad-Name"}, ""},
		{"MaxPayload", Config{MaxPayload: -1}, "-1 is negative"},
		{"Slot", Config{Slot: "slot\x00'; DROP"}, ""},
		{"Slot", Config{Slot: "sl\xffot"}, ""},
		{"Slot", Config{Slot: strings.Repeat("s", 64)}, ""},
	} {
		c := tc.cfg.withDefaults()
		cfgerrtest.RequireField(t, c.validate(), ErrInvalidConfig, "outbox: Config."+tc.field, tc.detail)
		_, err := New(&tc.cfg)
		require.ErrorIs(t, err, ErrInvalidConfig)
	}
}

func TestRelayConfigValidate(t *testing.T) {
	t.Parallel()
	rc := (*RelayConfig)(nil).withDefaults()
	require.NoError(t, rc.validate())
	require.Equal(t, time.Minute, rc.RetentionInterval)
	require.Equal(t, 1000, rc.RetentionBatch)
	require.Equal(t, retention.DefaultRate, rc.RetentionRate)
	for _, tc := range []struct {
		field  string
		cfg    RelayConfig
		detail string // what follows the field in the error, when pinned
	}{
		{"ID", RelayConfig{ID: "relay\x00"}, `"relay\x00" holds a control character`},
		{"ID", RelayConfig{ID: strings.Repeat("r", 256)}, "256 bytes, over 255"},
		{"BatchSize", RelayConfig{BatchSize: -1}, "-1 is negative"},
		{"Lease", RelayConfig{Lease: time.Millisecond}, "1ms is below 300ms"},
		{"PollInterval", RelayConfig{PollInterval: -1}, "-1ns is negative"},
		{"BusyPollInterval", RelayConfig{BusyPollInterval: -1}, "-1ns is negative"},
		{"BusyPollInterval", RelayConfig{PollInterval: time.Millisecond, BusyPollInterval: time.Second}, "1s is above PollInterval (1ms)"},
		{"PublishTimeout", RelayConfig{PublishTimeout: -1}, "-1ns is negative"},
		{"MaxAttempts", RelayConfig{MaxAttempts: -1}, "-1 is negative"},
		{"MinBackoff", RelayConfig{MinBackoff: -1}, "-1ns is negative"},
		{"MaxBackoff", RelayConfig{MinBackoff: time.Minute, MaxBackoff: time.Second}, "1s is below MinBackoff (1m0s)"},
		{"MaxBrokerBackoff", RelayConfig{MaxBrokerBackoff: -1}, "-1ns is negative"},
		{"RetentionBatch", RelayConfig{RetentionBatch: -1}, "-1 is negative"},
		{"RetentionInterval", RelayConfig{RetentionInterval: -1}, "-1ns is negative"},
		{"StatsInterval", RelayConfig{StatsInterval: -1}, "-1ns is negative"},
	} {
		c := tc.cfg.withDefaults()
		cfgerrtest.RequireField(t, c.validate(), ErrInvalidConfig, "outbox: RelayConfig."+tc.field, tc.detail)
	}
	// RetentionRate is not refused when negative: it means no limit.
	rc = (&RelayConfig{RetentionRate: -1}).withDefaults()
	require.NoError(t, rc.validate())
	require.Equal(t, -1, rc.RetentionRate)
}

// NewRelay's arguments are checked as its Config is: a nil pool, outbox
// or publisher wraps ErrInvalidConfig.
func TestNewRelayRejectsNilArguments(t *testing.T) {
	t.Parallel()
	_, err := NewRelay(nil, nil, nil, nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
}

// RelayConfig.Validate is NewRelay's check without a pool.
func TestRelayConfigValidateExported(t *testing.T) {
	t.Parallel()
	require.NoError(t, (*RelayConfig)(nil).Validate())
	require.NoError(t, (&RelayConfig{Lease: time.Second}).Validate())
	cfgerrtest.RequireField(t, (&RelayConfig{Lease: time.Millisecond}).Validate(), ErrInvalidConfig,
		"outbox: RelayConfig.Lease", "1ms is below 300ms")
}
