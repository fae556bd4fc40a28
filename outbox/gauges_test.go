package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/outbox"
)

// The oldest-unpublished gauge falls back to 0 as soon as the outbox
// drains, rather than keeping its last value until the next periodic
// refresh (an hour away here).
func TestOldestUnpublishedAgeResetsWhenDrained(t *testing.T) {
	t.Parallel()
	b := setup(t)
	subject := b.name + ".late.x" // no stream captures it yet: publishes fail
	_, err := b.db.Pool.Exec(context.Background(), `INSERT INTO outbox (id, partition, subject, payload, created_at)
		VALUES ($1, 0, $2, '', now() - interval '1 hour')`, uuid.New(), subject)
	require.NoError(t, err)
	pub, _ := publisher(t, b.nats.URL)
	setPartitions(t, b.db, 1)
	_, reg := b.startRelay(t, pub, outbox.RelayConfig{StatsInterval: time.Hour,
		MinBackoff: 50 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, MaxAttempts: 1000, PublishTimeout: time.Second})
	require.Eventually(t, func() bool {
		return metricValue(t, reg, "oncekit_outbox_oldest_unpublished_age_seconds") > 3000
	}, 20*time.Second, 20*time.Millisecond)

	_, err = natsjs.EnsureStream(context.Background(), b.nats.JS, natsjs.StreamConfig{Name: b.name + "_late", Subjects: []string{b.name + ".late.>"}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return backlog(t, b) == 0 }, 20*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool {
		return metricValue(t, reg, "oncekit_outbox_oldest_unpublished_age_seconds") == 0
	}, 5*time.Second, 20*time.Millisecond)
}

// partitions_owned follows the leases as they are taken, not one lease
// round (Lease/3) later.
func TestPartitionsOwnedFollowsTheLeases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pub, _ := publisher(t, b.nats.URL)
	setPartitions(t, b.db, 8)
	_, reg := b.startRelay(t, pub, outbox.RelayConfig{Lease: 30 * time.Second, ID: "n1"})
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM relay_partitions WHERE owner = 'n1' AND expires_at > now()`).Scan(&n))
		return n == 8
	}, 20*time.Second, 10*time.Millisecond)
	// The next lease round is 10 s away: the gauge must already say 8.
	require.Eventually(t, func() bool {
		return metricValue(t, reg, "oncekit_outbox_partitions_owned") == 8
	}, 3*time.Second, 10*time.Millisecond)
}
