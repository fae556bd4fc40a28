package retention_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/retention"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

func TestRetentionSpacing(t *testing.T) {
	require.Equal(t, time.Second/60, retention.Spacing(60_000, 1000))
	require.Equal(t, 2*time.Second, retention.Spacing(500, 1000))
	require.Zero(t, retention.Spacing(-1, 1000), "negative: no limit")
}

// Statements through Spaced start every apart, and one waiting for its
// turn gives up when its context ends.
func TestSpacedStatements(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	require.Equal(t, oncekit.Querier(db.Pool), retention.Spaced(db.Pool, 0), "every 0: q itself")
	q := retention.Spaced(db.Pool, 50*time.Millisecond)
	ctx := context.Background()
	start := time.Now()
	for range 4 {
		var one int
		require.NoError(t, q.QueryRow(ctx, "SELECT 1").Scan(&one))
	}
	require.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond)

	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	_, err := q.Exec(short, "SELECT 1")
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestDefaultRetention(t *testing.T) {
	t.Parallel()
	var (
		interval    time.Duration
		batch, rate int
	)
	retention.Defaults(&interval, &batch, &rate)
	if interval != time.Minute || batch != 1000 || rate != retention.DefaultRate {
		t.Fatalf("defaults: %v, %d, %d", interval, batch, rate)
	}
	interval, batch, rate = time.Second, 5, -1
	retention.Defaults(&interval, &batch, &rate)
	if interval != time.Second || batch != 5 || rate != -1 {
		t.Fatalf("set values changed: %v, %d, %d", interval, batch, rate)
	}
}
