package brokertests_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// A dead letter goes back through the broker the consumer reads, whichever
// it is: Store.Replay takes any broker.Publisher. A poison message on
// RabbitMQ or Redis Streams is dead-lettered, replayed through the watermill
// publisher once the handler is fixed, and processed once.
func TestDeadLetterReplayThroughWatermill(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"rabbitmq", "redis"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			var addr, dest string
			if kind == "rabbitmq" {
				addr = testenv.RabbitMQURL(t)
				dest = newQueue(t, addr, nil)
			} else {
				addr = testenv.RedisAddr(t)
				dest, _ = newStream(t, addr)
			}
			db := testenv.NewDB(t)
			ctx := context.Background()
			_, err := db.Pool.Exec(ctx, `CREATE TABLE effects (message_id uuid NOT NULL)`)
			require.NoError(t, err)
			pub, closePub, err := newPublisher(kind, addr)
			require.NoError(t, err)
			defer closePub()
			src, closeSrc, err := newSource(kind, addr, dest, nil)
			require.NoError(t, err)
			defer closeSrc()

			var fixed atomic.Bool
			h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
				if !fixed.Load() {
					return inbox.Permanent(errors.New("unknown schema version"))
				}
				return insertEffect(ctx, tx, msg)
			})
			c, err := inbox.NewConsumer(db.Pool, src, h, consumerConfig(db.Schema))
			require.NoError(t, err)
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- c.Run(rctx) }()
			defer func() { cancel(); <-done }()

			id := uuid.New()
			res := pub.Publish(ctx, []broker.Message{{ID: id, Subject: dest, Key: "k", Payload: []byte("poison"), Headers: map[string]string{"X-Tenant": "acme"}}})
			require.NoError(t, res[0].Err)
			require.Eventually(t, func() bool { return c.Stats().DeadLettered == 1 }, 30*time.Second, 20*time.Millisecond)

			store, err := inbox.NewStore(db.Schema)
			require.NoError(t, err)
			dls, err := store.ListDeadLetters(ctx, db.Pool, inbox.DeadLetterFilter{Consumer: "c"})
			require.NoError(t, err)
			require.Len(t, dls, 1)
			require.Equal(t, dest, dls[0].Subject)
			fixed.Store(true)
			_, err = store.Replay(ctx, db.Pool, pub, dls[0].ID, inbox.ReplayOptions{})
			require.NoError(t, err)

			require.Eventually(t, func() bool { return c.Stats().Processed == 1 }, 30*time.Second, 20*time.Millisecond)
			var n int
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE message_id = $1`, id).Scan(&n))
			require.Equal(t, 1, n, "processed once, under its original ID")
			dl, err := store.GetDeadLetter(ctx, db.Pool, dls[0].ID)
			require.NoError(t, err)
			require.NotNil(t, dl.ReplayedAt)
		})
	}
}
