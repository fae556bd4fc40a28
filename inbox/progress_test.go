package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/inbox"
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
				time.Sleep(3 * ackWait / 2)
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
			time.Sleep(ackWait)
			require.Zero(t, c.Stats().Duplicates, "no message was redelivered")
			require.Equal(t, want, b.effects())
			require.Equal(t, 3, b.count(`SELECT count(*) FROM effects WHERE attempt = 1`), "each message processed on its first delivery")
		})
	}
}
