package inbox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The redelivery delay doubles from MinBackoff and stops at MaxBackoff.
func TestBackoffDoublesUpToItsMaximum(t *testing.T) {
	t.Parallel()
	c := (&Config{Name: "n"}).withDefaults()
	var got []time.Duration
	for attempt := 1; attempt <= 10; attempt++ {
		got = append(got, c.backoff(attempt))
	}
	require.Equal(t, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second,
		32 * time.Second, 64 * time.Second, 128 * time.Second, 256 * time.Second, 5 * time.Minute}, got)
	c.MinBackoff, c.MaxBackoff = 10*time.Millisecond, 10*time.Millisecond
	require.Equal(t, 10*time.Millisecond, c.backoff(1000))
}
