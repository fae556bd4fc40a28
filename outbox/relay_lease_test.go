package outbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/outbox"
)

// gatedPublisher holds its first Publish until the gate opens.
type gatedPublisher struct {
	broker.Publisher
	once    sync.Once
	entered chan struct{}
	gate    chan struct{}
}

func (g *gatedPublisher) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	g.once.Do(func() {
		close(g.entered)
		<-g.gate
	})
	return g.Publisher.Publish(ctx, msgs)
}

func TestRelayIsFencedWhenItsLeaseIsTaken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	setPartitions(t, b.db, 1)
	b.ob = newOutbox(t, b.db, outbox.Config{})
	first := []broker.Message{b.msg("k", 1), b.msg("k", 2)}
	enqueue(t, b.db, b.ob, first...)

	np, _ := publisher(t, b.nats.URL)
	gp := &gatedPublisher{Publisher: np, entered: make(chan struct{}), gate: make(chan struct{})}
	b.startRelay(t, gp, outbox.RelayConfig{Lease: 3 * time.Second, PollInterval: 20 * time.Millisecond})
	select {
	case <-gp.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("relay never published")
	}
	// While the batch is in flight another owner takes the partition.
	_, err := b.db.Pool.Exec(ctx, `UPDATE relay_partitions SET owner = 'other', token = token + 1, expires_at = now() + interval '1 hour'`)
	require.NoError(t, err)
	close(gp.gate)

	// The publish went out, but the fenced mark changed nothing...
	waitCount(t, b.stream, 2, 20*time.Second)
	// the cursor stayed where it was and the batch is still pending.
	require.Never(t, func() bool {
		var seq int64
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT cursor_seq FROM relay_partitions WHERE partition = 0`).Scan(&seq))
		return seq != 0
	}, 300*time.Millisecond, 20*time.Millisecond)
	require.EqualValues(t, 2, backlog(t, b))
	require.Zero(t, publishedRows(t, b.db))

	// ...and the relay publishes nothing more on a partition it lost.
	enqueue(t, b.db, b.ob, b.msg("k", 3))
	require.Never(t, func() bool { return streamCount(t, b.stream) > 2 }, 500*time.Millisecond, 20*time.Millisecond)

	// Once the other owner lets go, the relay takes over again: the unmarked
	// batch is republished (absorbed by JetStream's dedup), then the rest.
	_, err = b.db.Pool.Exec(ctx, `UPDATE relay_partitions SET owner = NULL, expires_at = '-infinity'`)
	require.NoError(t, err)
	waitCount(t, b.stream, 3, 20*time.Second)
	require.Eventually(t, func() bool { return backlog(t, b) == 0 }, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, 3, publishedRows(t, b.db))
	require.EqualValues(t, 3, streamCount(t, b.stream))
}
