package aspubsub_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/watermill/aspubsub"
)

// The Publisher writes in the caller's transaction: a rollback takes the
// messages with it, a commit leaves them for the relay. The same watermill
// message published twice to a topic is one event.
func TestPublisherWritesInCallersTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	pending := func() int64 {
		bl, err := ob.Backlog(ctx, db.Pool)
		require.NoError(t, err)
		return bl.Pending
	}
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order":"42"}`))
	msg.Metadata.Set("X-Tenant", "acme")

	publishIn := func(commit bool) {
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		pub, err := aspubsub.NewPublisher(tx, &aspubsub.PublisherConfig{Outbox: outbox.Config{Schema: db.Schema}})
		require.NoError(t, err)
		require.NoError(t, pub.Publish("orders.placed", msg))
		require.NoError(t, pub.Publish("orders.placed", msg), "a second copy is a no-op")
		if commit {
			require.NoError(t, tx.Commit(ctx))
		}
	}
	publishIn(false)
	require.Zero(t, pending(), "rolled back with the caller's transaction")
	publishIn(true)
	require.EqualValues(t, 1, pending(), "committed with it, once")

	var subject, uuidHeader, tenant, key string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT subject, headers->>'Oncekit-Watermill-Uuid', headers->>'X-Tenant', ordering_key FROM outbox WHERE id = $1`,
		aspubsub.EventID("orders.placed", msg)).Scan(&subject, &uuidHeader, &tenant, &key))
	require.Equal(t, "orders.placed", subject)
	require.Equal(t, msg.UUID, uuidHeader)
	require.Equal(t, "acme", tenant)
	require.Equal(t, "orders.placed", key, "a topic is one ordering key by default")
	require.NotEqual(t, aspubsub.EventID("orders.placed", msg), aspubsub.EventID("orders.shipped", msg), "one event per topic")
}
