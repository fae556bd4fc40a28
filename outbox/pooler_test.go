package outbox_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// Through PgBouncer in transaction pooling mode, with pgx describing
// nothing (exec) or caching descriptions (cache_describe), writers enqueue
// (and notify), the relay publishes every event once in order per key, and
// Unpark takes its IDs; the relay does not LISTEN there, where the LISTEN
// would be lost with its transaction, and says so once at start.
func TestRelayThroughPgBouncer(t *testing.T) {
	t.Parallel()
	for _, mode := range testenv.PooledModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setupDB(t, testenv.NewDBOn(t, testenv.PooledURL(t, mode)))
			b.ob = newOutbox(t, b.db, outbox.Config{Notify: true})
			var want []broker.Message
			for i := range 300 {
				want = append(want, b.msg(string(rune('a'+i%5)), i))
			}
			for i := 0; i < len(want); i += 50 {
				enqueue(t, b.db, b.ob, want[i:i+50]...)
			}
			logs := &testenv.SyncBuffer{}
			pub, _ := publisher(t, b.nats.URL)
			b.startRelay(t, pub, outbox.RelayConfig{Logger: slog.New(slog.NewTextHandler(logs, nil))})
			waitCount(t, b.stream, uint64(len(want)), 30*time.Second)
			requireExactlyOnceInOrder(t, readStream(t, b.stream), want)
			require.Contains(t, logs.String(), "not listening for notifications: the pool goes through a connection pooler")
			require.Contains(t, logs.String(), "poll_only=true")
			n, err := b.ob.Unpark(context.Background(), b.db.Pool, uuid.New())
			require.NoError(t, err)
			require.Zero(t, n)
		})
	}
}

// On a direct connection the relay listens, as before.
func TestRelayListensOnADirectPool(t *testing.T) {
	t.Parallel()
	testenv.RequireDirect(t, "the relay listens only on a direct pool")
	b := setup(t)
	logs := &testenv.SyncBuffer{}
	pub, _ := publisher(t, b.nats.URL)
	b.startRelay(t, pub, outbox.RelayConfig{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	require.Eventually(t, func() bool { return len(logs.String()) > 0 }, 10*time.Second, 10*time.Millisecond)
	require.Contains(t, logs.String(), "poll_only=false")
	require.NotContains(t, logs.String(), "not listening")
}
