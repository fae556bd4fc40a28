package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

func TestRelayWakesOnNotify(t *testing.T) {
	t.Parallel()
	testenv.RequireDirect(t, "the relay LISTENs only on a direct pool")
	b := setup(t)
	b.ob = newOutbox(t, b.db, outbox.Config{Notify: true})
	pub, _ := publisher(t, b.nats.URL)
	// Polling alone would take up to a minute: only the notification can
	// make the relay look in time.
	b.startRelay(t, pub, outbox.RelayConfig{PollInterval: time.Minute, BusyPollInterval: time.Minute})
	require.Eventually(t, func() bool {
		var owned int
		err := b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM relay_partitions WHERE owner IS NOT NULL`).Scan(&owned)
		return assert.NoError(t, err) && owned == outbox.DefaultPartitions
	}, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return listeners(t, b) == 1 }, 10*time.Second, 10*time.Millisecond)
	for i := range 3 {
		enqueue(t, b.db, b.ob, b.msg("k", i))
		waitCount(t, b.stream, uint64(i+1), 5*time.Second)
	}
}

func TestRelayPollOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pub, _ := publisher(t, b.nats.URL)
	b.startRelay(t, pub, outbox.RelayConfig{PollOnly: true, PollInterval: 50 * time.Millisecond})
	for i := range 3 {
		enqueue(t, b.db, b.ob, b.msg("k", i))
		waitCount(t, b.stream, uint64(i+1), 10*time.Second)
	}
	require.Zero(t, listeners(t, b))
}

// listeners counts sessions whose last statement was LISTEN on b's channel.
func listeners(t *testing.T, b *bundle) int {
	t.Helper()
	var n int
	assert.NoError(t, b.db.Pool.QueryRow(context.Background(), // t.Errorf: safe in Eventually conditions
		`SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN "' || $1 || '"'`, outbox.NotifyChannel(b.db.Schema)).Scan(&n))
	return n
}
