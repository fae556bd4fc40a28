package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/migrations"
	"github.com/oncekit/oncekit/outbox"
)

func TestRelayRetriedMessageReleasesItsFollowersInOrder(t *testing.T) {
	t.Parallel()
	t.Run("chained", func(t *testing.T) {
		t.Parallel()
		testRetryReleasesFollowers(t, func(p *natsjs.Publisher) broker.Publisher { return p })
	})
	t.Run("rounds", func(t *testing.T) {
		t.Parallel()
		testRetryReleasesFollowers(t, func(p *natsjs.Publisher) broker.Publisher { return plainPublisher{p} })
	})
}

func testRetryReleasesFollowers(t *testing.T, wrap func(*natsjs.Publisher) broker.Publisher) {
	b := setup(t)
	ctx := context.Background()
	// First a batch that goes through, so that k1's partition is known to
	// have no held rows; then bad, to a subject no stream captures until the
	// test adds one, and the next message of its key.
	k1 := []broker.Message{b.msg("k1", 0)}
	flowing := []broker.Message{b.msg("k2", 1), b.msg("", 1)}
	enqueue(t, b.db, b.ob, k1...)
	enqueue(t, b.db, b.ob, flowing...)
	np, _ := publisher(t, b.nats.URL)
	b.startRelay(t, wrap(np), outbox.RelayConfig{
		MaxAttempts: 1000, MinBackoff: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		PublishTimeout: 2 * time.Second, PollInterval: 20 * time.Millisecond,
	})
	waitCount(t, b.stream, 3, 20*time.Second)
	require.Eventually(t, func() bool { return backlog(t, b) == 0 }, 20*time.Second, 20*time.Millisecond)
	flowing = append(flowing, k1[0])

	bad := b.msg("k1", 1)
	bad.Subject = b.name + ".later"
	k1 = []broker.Message{bad, b.msg("k1", 2)}
	enqueue(t, b.db, b.ob, k1...)

	// bad keeps failing; the next message of its key waits behind it, held
	// as a follower with its attempts untouched.
	state := func(m broker.Message) (attempts int, follower bool) {
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT attempts, coalesce(next_attempt_at = '-infinity', false) AND parked_at IS NULL
			FROM outbox WHERE id = $1`, m.ID).Scan(&attempts, &follower))
		return attempts, follower
	}
	require.Eventually(t, func() bool {
		n, _ := state(bad)
		_, follows := state(k1[1])
		return n >= 2 && follows
	}, 20*time.Second, 20*time.Millisecond)
	n, _ := state(k1[1])
	require.Zero(t, n)

	// Meanwhile k1's new messages wait too, other keys flow past.
	k1 = append(k1, b.msg("k1", 3))
	flowing = append(flowing, b.msg("k2", 2))
	enqueue(t, b.db, b.ob, k1[len(k1)-1], flowing[len(flowing)-1])
	waitCount(t, b.stream, uint64(len(flowing)), 20*time.Second)
	require.Never(t, func() bool { return streamCount(t, b.stream) > uint64(len(flowing)) }, 300*time.Millisecond, 20*time.Millisecond)
	requireExactlyOnceInOrder(t, readStream(t, b.stream), flowing)
	require.EqualValues(t, len(k1), backlog(t, b))

	// The cause is fixed: the retry succeeds and k1 follows, in order.
	_, err := natsjs.EnsureStream(ctx, b.nats.JS, natsjs.StreamConfig{Name: b.name, Subjects: []string{b.subject + ".>", bad.Subject}})
	require.NoError(t, err)
	all := append(append([]broker.Message{}, flowing...), k1...)
	waitCount(t, b.stream, uint64(len(all)), 20*time.Second)
	require.Eventually(t, func() bool { return backlog(t, b) == 0 }, 20*time.Second, 20*time.Millisecond)
	requireExactlyOnceInOrder(t, readStream(t, b.stream), all)
	require.Equal(t, len(all), publishedRows(t, b.db))
	var lastErr *string
	var attempts int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT attempts, last_error FROM outbox WHERE id = $1`, bad.ID).Scan(&attempts, &lastErr))
	require.Greater(t, attempts, 2, "the failures and the success")
	require.Nil(t, lastErr)
}

func TestUpgradeFrom004KeepsPendingRowsPending(t *testing.T) {
	t.Parallel()
	b := setupDB(t, testenv.NewDBAt(t, 4))
	ctx := context.Background()
	exec := func(sql string, args ...any) {
		_, err := b.db.Pool.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	// What a relay of release 004 left: published messages moved to
	// outbox_published, pending ones, a parked one and the next of its key,
	// and leases (a relay of 004 created the partitions' rows).
	exec(`INSERT INTO relay_partitions (partition) SELECT generate_series(0, 15)`)
	published := []broker.Message{b.msg("k1", 0), b.msg("", 0), b.msg("k2", 0)}
	enqueue004(t, b, published...)
	ids := []any{published[0].ID, published[1].ID, published[2].ID}
	exec(`WITH d AS (DELETE FROM outbox WHERE id IN ($1, $2, $3) RETURNING *)
		INSERT INTO outbox_published (id, seq, partition, ordering_key, subject, created_at, attempts)
		SELECT id, seq, partition, ordering_key, subject, created_at, 1 FROM d`, ids...)
	pending := []broker.Message{b.msg("k1", 1), b.msg("k1", 2), b.msg("k2", 1), b.msg("", 1)}
	enqueue004(t, b, pending...)
	parked, k3next := b.msg("k3", 0), b.msg("k3", 1)
	enqueue004(t, b, parked, k3next)
	exec(`UPDATE outbox SET attempts = 10, next_attempt_at = now(), parked_at = now(), last_error = 'no stream' WHERE id = $1`, parked.ID)
	exec(`INSERT INTO relay_partitions (partition, owner, token, expires_at)
		SELECT generate_series(0, 15), 'old', 7, now() - interval '1 minute'
		ON CONFLICT (partition) DO UPDATE SET owner = excluded.owner, token = excluded.token, expires_at = excluded.expires_at`)

	applied, err := migrations.Up(ctx, b.db.Pool, migrations.WithSchema(b.db.Schema))
	require.NoError(t, err)
	require.Len(t, applied, len(migrations.All())-4)

	// Pending rows are still pending, the parked one parked, the history
	// published (without its payload) and still a duplicate for Enqueue.
	require.EqualValues(t, len(pending)+1, backlog(t, b))
	list := func(s outbox.State) []outbox.Entry {
		es, err := b.ob.List(ctx, b.db.Pool, outbox.ListOptions{State: s})
		require.NoError(t, err)
		return es
	}
	require.Len(t, list(outbox.StatePending), len(pending)+1)
	require.Len(t, list(outbox.StateParked), 1)
	history := list(outbox.StatePublished)
	require.Len(t, history, len(published))
	for _, e := range history {
		require.Equal(t, outbox.StatePublished, e.State())
		require.Nil(t, e.PayloadSize)
	}
	res := enqueue(t, b.db, b.ob, published[1])
	require.Equal(t, 0, res.Inserted)
	var count int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_published`).Scan(&count))
	require.Zero(t, count)

	// A relay publishes the pending rows, in order, and nothing of the
	// history; k3 waits for its parked row until it is unparked.
	pub, _ := publisher(t, b.nats.URL)
	b.startRelay(t, pub, outbox.RelayConfig{PollInterval: 20 * time.Millisecond})
	waitCount(t, b.stream, uint64(len(pending)), 20*time.Second)
	require.Never(t, func() bool { return streamCount(t, b.stream) > uint64(len(pending)) }, 300*time.Millisecond, 20*time.Millisecond)
	requireExactlyOnceInOrder(t, readStream(t, b.stream), pending)
	n, err := b.ob.Unpark(ctx, b.db.Pool, parked.ID)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	waitCount(t, b.stream, uint64(len(pending)+2), 20*time.Second)
	requireExactlyOnceInOrder(t, readStream(t, b.stream), append(pending, parked, k3next))
	require.Eventually(t, func() bool { return backlog(t, b) == 0 }, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, len(published)+len(pending)+2, publishedRows(t, b.db))
}

// enqueue004 writes msgs as a writer of release 004 did: the partition
// computed from the count of 16, no epoch.
func enqueue004(t *testing.T, b *bundle, msgs ...broker.Message) {
	t.Helper()
	for _, m := range msgs {
		_, err := b.db.Pool.Exec(context.Background(), `INSERT INTO outbox (id, partition, ordering_key, subject, payload)
			VALUES ($1, $2, $3, $4, $5)`, m.ID, outbox.PartitionOf(m, 16), m.Key, m.Subject, m.Payload)
		require.NoError(t, err)
	}
}
