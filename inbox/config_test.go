package inbox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/cfgerr/cfgerrtest"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/retention"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	c := (&Config{Name: "c"}).withDefaults()
	require.NoError(t, c.validate())
	require.Equal(t, pgsql.DefaultSchema, c.Schema)
	require.Equal(t, 4, c.Concurrency)
	require.Equal(t, 1, c.BatchSize)
	require.Equal(t, 25, c.MaxAttempts)
	require.Equal(t, 7*24*time.Hour, c.Retention)
	require.Equal(t, time.Minute, c.RetentionInterval)
	require.Equal(t, 1000, c.RetentionBatch)
	require.Equal(t, retention.DefaultRate, c.RetentionRate)
	require.Equal(t, 7*24*time.Hour, c.DeadLetterRetention)
	require.Equal(t, []time.Duration{time.Second, 5 * time.Minute}, []time.Duration{c.MinBackoff, c.MaxBackoff})
	require.NotNil(t, c.Logger)
	require.NotNil(t, c.Propagator)
	for _, tc := range []struct {
		field  string
		cfg    *Config
		detail string // what follows the field in the error, when pinned
	}{
		{"Name", nil, "required"},
		{"Name", &Config{}, "required"},
		{"Name", &Config{Name: "ledger\x00"}, `"ledger\x00" holds a control character`},
		{"Name", &Config{Name: "\xff"}, "not valid UTF-8"},
		{"Schema", &Config{Name: "c", Schema: "Bad-Name"}, ""},
		{"Concurrency", &Config{Name: "c", Concurrency: -1}, "-1 is negative"},
		{"BatchSize", &Config{Name: "c", BatchSize: -1}, "-1 not in 1..1000"},
		{"BatchSize", &Config{Name: "c", BatchSize: 1001}, "1001 not in 1..1000"},
		{"MaxAttempts", &Config{Name: "c", MaxAttempts: -1}, "-1 is negative"},
		{"RetentionInterval", &Config{Name: "c", RetentionInterval: -1}, "-1ns is negative"},
		{"RetentionBatch", &Config{Name: "c", RetentionBatch: -1}, "-1 is negative"},
	} {
		c := tc.cfg.withDefaults()
		cfgerrtest.RequireField(t, c.validate(), ErrInvalidConfig, "inbox: Config."+tc.field, tc.detail)
	}
	// Negative retentions keep rows forever and a negative RetentionRate
	// means no limit: none of them is refused.
	c = (&Config{Name: "c", Retention: -1, DeadLetterRetention: -1, RetentionRate: -1}).withDefaults()
	require.NoError(t, c.validate())
	c = (&Config{Name: "c", Schema: "Bad-Name"}).withDefaults()
	require.ErrorIs(t, c.validate(), pgsql.ErrInvalidSchema, "the cause is wrapped too")
}
