package outbox_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// A relay whose role lost its grant on the outbox logs one error for the
// cause, not a warning per batch, counts it and reports it by Healthy,
// publishes nothing it cannot mark, and once the grant is back publishes
// every event once, in order.
func TestRelayStatementRefusedIsAnErrorCountedAndUnhealthy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	role := testenv.NewRuntimeRole(t, b.db)

	var logs testenv.SyncBuffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("relay log:\n%s", logs.String())
		}
	})
	reg := prometheus.NewRegistry()
	pub, _ := publisher(t, b.nats.URL)
	r, err := outbox.NewRelay(role.Pool, b.ob, pub, &outbox.RelayConfig{
		Registerer: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Lease: 2 * time.Second, PollInterval: 100 * time.Millisecond, MaxBrokerBackoff: 200 * time.Millisecond,
	})
	require.NoError(t, err)
	require.NoError(t, r.Healthy(ctx))
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	require.Eventually(t, func() bool {
		return testenv.Metric(t, reg, "oncekit_outbox_partitions_owned") == 16
	}, 30*time.Second, 10*time.Millisecond)

	// The grant is taken away under the running relay; then events come.
	role.Exec(t, b.db, `REVOKE SELECT ON outbox FROM %s`)
	var want []broker.Message
	for i := range 30 {
		want = append(want, b.msg([]string{"a", "b", "c"}[i%3], i))
	}
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = b.ob.Enqueue(ctx, tx, want...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	errorsTotal := func() float64 {
		return testenv.Metric(t, reg, "oncekit_outbox_statement_errors_total", "statement", "batch", "class", "42")
	}
	require.Eventually(t, func() bool { return errorsTotal() >= 5 && r.Healthy(ctx) != nil },
		30*time.Second, 10*time.Millisecond, "errors %v, healthy %v\n%s", errorsTotal(), r.Healthy(ctx), logs.String())
	herr := r.Healthy(ctx)
	require.ErrorIs(t, herr, oncekit.ErrStatementBroken)
	require.Contains(t, herr.Error(), "permission denied for table outbox")
	t.Logf("Healthy: %v", herr)
	t.Logf("oncekit_outbox_statement_errors_total{statement=batch,class=42} = %v", errorsTotal())

	out := logs.String()
	require.Equal(t, 1, strings.Count(out, "statement=batch class=42"), "one error line for the cause, however many batches:\n%s", out)
	require.NotContains(t, out, "batch failed; backing off", "no warning per batch")
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "level=ERROR") {
			t.Logf("log: %s", l)
		}
	}
	require.Equal(t, 0, publishedRows(t, b.db), "nothing marked published")

	role.Exec(t, b.db, `GRANT SELECT ON outbox TO %s`)
	require.Eventually(t, func() bool { return publishedRows(t, b.db) == len(want) }, 30*time.Second, 20*time.Millisecond)
	requireExactlyOnceInOrder(t, readStream(t, b.stream), want)
	require.Eventually(t, func() bool { return r.Healthy(ctx) == nil }, 10*time.Second, 10*time.Millisecond)
	require.Contains(t, logs.String(), `msg="statement succeeds again" component=outbox.relay`)
}
