package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/inbox"
)

// A batch consumer applies every message it is handed within moments,
// however many fewer than its batch holds arrive last; none waits for the
// source's AckWait (redelivered) without a failure. Each round publishes a
// run of messages that does not divide into batches and times the
// consumer until the last is applied, well inside AckWait.
func TestNoMessageWaitsForAckWait(t *testing.T) {
	t.Parallel()
	for _, queued := range []bool{false, true} {
		name := "exec"
		if queued {
			name = "queued"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			// Long enough for a loaded machine's slowest round (5.5 s seen
			// at load 25): a message that waited for it would not be
			// applied before it.
			const ackWait = 20 * time.Second
			src := b.source("stall", ackWait)
			h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
				if queued {
					return inbox.Queue(ctx, tx, `INSERT INTO effects (message_id) VALUES ($1)`, msg.ID)
				}
				return insertEffect(ctx, tx, msg)
			})
			cfg := b.config("stall")
			cfg.Concurrency, cfg.BatchSize = 4, 200
			c := b.start(src, h, cfg)
			total := 0
			for round, n := range []int{3001, 777, 1, 199, 2050, 13} {
				start := time.Now()
				b.publish(b.msgs(n)...)
				total += n
				require.Eventually(t, func() bool { return c.Stats().Processed >= int64(total) }, ackWait, time.Millisecond,
					"round %d (%d messages): %d of %d applied after %v; stats %+v", round, n, c.Stats().Processed, total, time.Since(start), c.Stats())
				t.Logf("round %d: %d messages applied in %v", round, n, time.Since(start).Round(time.Millisecond))
			}
			require.Equal(t, total, b.count(`SELECT count(*) FROM effects`))
			require.Zero(t, c.Stats().Duplicates, "nothing was redelivered")
		})
	}
}

// A consumer far slower than its source's prefetch: nothing it holds,
// handed to it or still waiting in the source, is redelivered while it
// works through it. Each message is delivered and applied once.
func TestSlowConsumerGetsNothingRedelivered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const ackWait, n = 2 * time.Second, 200
	src := b.source("slow", ackWait)
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		time.Sleep(25 * time.Millisecond) // the handler's work: 200 messages take 2.5 AckWaits
		return insertEffect(ctx, tx, msg)
	})
	cfg := b.config("slow")
	cfg.Concurrency, cfg.BatchSize = 1, 1
	start := time.Now()
	c := b.start(src, h, cfg)
	b.publish(b.msgs(n)...)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed >= n })
	require.Greater(t, time.Since(start), 2*ackWait, "the consumer was as slow as meant")
	require.Zero(t, c.Stats().Duplicates, "copies redelivered while the consumer held the messages")
	require.Equal(t, n, b.count(`SELECT count(*) FROM effects`))
}
