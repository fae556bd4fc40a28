package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// A handler that runs past the source's AckWait keeps its message in
// progress at the broker, and so does the message queued behind it: neither
// is redelivered meanwhile, so no copy waits on a claim to end as a
// duplicate.
func TestSlowHandlerKeepsMessagesInProgress(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 2} {
		t.Run(map[int]string{1: "single", 2: "batch"}[batch], func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			const ackWait = time.Second
			h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
				time.Sleep(3 * ackWait / 2) // a handler slower than AckWait on purpose, not a wait for state
				return insertEffect(ctx, tx, msg)
			})
			cfg := b.config("c")
			cfg.Concurrency = 1
			cfg.BatchSize = batch
			cfg.Retention = -1
			c := b.start(b.source("d", ackWait), h, cfg)
			want := map[uuid.UUID]int{}
			for i := range 3 {
				m := b.msg("", i)
				b.publish(m)
				want[m.ID] = 1
			}
			waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == 3 })
			// A copy redelivered during the run would be settled right
			// after its original: give one more AckWait for it to show.
			// Time passes on purpose: the state looked for must not come.
			time.Sleep(ackWait)
			require.Zero(t, c.Stats().Duplicates, "no message was redelivered")
			require.Equal(t, want, b.effects())
			require.Equal(t, 3, b.count(`SELECT count(*) FROM effects WHERE attempt = 1`), "each message processed on its first delivery")
		})
	}
}

// The in-hand gauges show what a consumer holds and for how long: a handler
// that takes long (or is stuck) makes the oldest message's age grow past
// AckWait, and both fall back to zero once everything is settled.
func TestInHandGauges(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const ackWait = 300 * time.Millisecond
	release := make(chan struct{})
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		<-release
		return insertEffect(ctx, tx, msg)
	})
	cfg := b.config("c")
	cfg.Concurrency = 1
	cfg.Retention = -1
	reg := cfg.Registerer.(*prometheus.Registry)
	c := b.start(b.source("d", ackWait), h, cfg)
	for i := range 3 {
		b.publish(b.msg("", i))
	}
	gauge := func(name string) float64 { return testenv.Metric(t, reg, name, "consumer", "c") }
	require.Eventually(t, func() bool {
		return gauge("oncekit_inbox_in_hand") == 3 && gauge("oncekit_inbox_oldest_in_hand_seconds") > 2*ackWait.Seconds()
	}, 20*time.Second, 10*time.Millisecond, "three messages held, the oldest for longer than AckWait")
	close(release)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == 3 })
	require.Eventually(t, func() bool {
		return gauge("oncekit_inbox_in_hand") == 0 && gauge("oncekit_inbox_oldest_in_hand_seconds") == 0
	}, 20*time.Second, 10*time.Millisecond, "nothing held once everything is settled")
	require.Zero(t, c.Stats().Duplicates, "held messages were kept in progress")
}
