package inbox_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// A claim PostgreSQL refuses for every message (the runtime role lost its
// grant on processed_messages) is an error logged once, not a warning per
// message: counted, reported by Healthy, and retried with backoff without
// acking anything; once the grant is back, every message is applied once.
func TestClaimRefusedForEveryMessageIsAnErrorCountedAndUnhealthy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	role := testenv.NewRuntimeRole(t, b.db)

	var logs testenv.SyncBuffer
	reg := prometheus.NewRegistry()
	cfg := b.config("broken-claim")
	cfg.Registerer = reg
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	c, err := inbox.NewConsumer(role.Pool, b.source("broken-claim", 5*time.Second), inbox.HandlerFunc(insertEffect), cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	// Run checks the role's grants at start: the grant is lost afterwards,
	// under a running consumer.
	first := b.msgs(1)
	b.publish(first...)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == 1 })
	require.NoError(t, c.Healthy(ctx))
	role.Exec(t, b.db, `REVOKE INSERT ON processed_messages FROM %s`)
	const n = 50
	b.publish(b.msgs(n)...)

	errorsTotal := func() float64 {
		return testenv.Metric(t, reg, "oncekit_inbox_statement_errors_total",
			"consumer", "broken-claim", "statement", "claim", "class", "42")
	}
	require.Eventually(t, func() bool { return errorsTotal() >= n && c.Healthy(ctx) != nil },
		30*time.Second, 10*time.Millisecond, "errors %v, healthy %v", errorsTotal(), c.Healthy(ctx))
	herr := c.Healthy(ctx)
	require.ErrorIs(t, herr, oncekit.ErrStatementBroken)
	require.Contains(t, herr.Error(), "permission denied for table processed_messages")
	require.Contains(t, herr.Error(), "claim failing since")
	t.Logf("Healthy: %v", herr)
	t.Logf("oncekit_inbox_statement_errors_total{statement=claim,class=42} = %v", errorsTotal())

	require.Equal(t, 1, b.count(`SELECT count(*) FROM effects`), "no handler ran without its claim")
	require.EqualValues(t, 1, c.Stats().Processed+c.Stats().DeadLettered+c.Stats().Terminated)
	out := logs.String()
	require.Equal(t, 1, strings.Count(out, "level=ERROR"), "one error line for the cause, however many messages:\n%s", out)
	require.Contains(t, out, `msg="statement refused by PostgreSQL as sent; it fails until an operator fixes the cause" consumer=broken-claim statement=claim class=42`)
	require.NotContains(t, out, "level=WARN", "no warning per message")
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "level=ERROR") {
			t.Logf("log: %s", l)
		}
	}

	role.Exec(t, b.db, `GRANT INSERT ON processed_messages TO %s`)
	require.Eventually(t, func() bool { return len(b.effects()) == n+1 }, 60*time.Second, 20*time.Millisecond)
	for id, k := range b.effects() {
		require.Equal(t, 1, k, id)
	}
	require.Eventually(t, func() bool { return c.Healthy(ctx) == nil }, 10*time.Second, 10*time.Millisecond)
	require.Contains(t, logs.String(), `msg="statement succeeds again" consumer=broken-claim statement=claim`)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == n+1 })
}
