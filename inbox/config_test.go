package inbox

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgsql"
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
	require.Equal(t, 7*24*time.Hour, c.DeadLetterRetention)
	require.NotNil(t, c.Backoff)
	require.NotNil(t, c.Logger)
	require.NotNil(t, c.Propagator)
	for _, tc := range []struct {
		field string
		cfg   *Config
	}{
		{"Name", nil},
		{"Name", &Config{}},
		{"Schema", &Config{Name: "c", Schema: "Bad-Name"}},
		{"Concurrency", &Config{Name: "c", Concurrency: -1}},
		{"BatchSize", &Config{Name: "c", BatchSize: -1}},
		{"BatchSize", &Config{Name: "c", BatchSize: 1001}},
		{"MaxAttempts", &Config{Name: "c", MaxAttempts: -1}},
		{"RetentionInterval", &Config{Name: "c", RetentionInterval: -1}},
		{"RetentionBatch", &Config{Name: "c", RetentionBatch: -1}},
	} {
		c := tc.cfg.withDefaults()
		err := c.validate()
		require.Error(t, err, "%+v", tc.cfg)
		require.True(t, errors.Is(err, ErrInvalidConfig), "%v", err)
		require.True(t, strings.HasPrefix(err.Error(), "inbox: Config."+tc.field+": "), "%v", err)
	}
	c = (&Config{Name: "c", Schema: "Bad-Name"}).withDefaults()
	require.ErrorIs(t, c.validate(), pgsql.ErrInvalidSchema, "the cause is wrapped too")
}
