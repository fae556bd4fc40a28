package brokertests_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/watermill/asbroker"
)

// The relay tells a broker outage from refused messages by Connected, the
// configured probe; a call whose context has ended reports the context's
// error for every message.
func TestPublisherConnectedAndContext(t *testing.T) {
	t.Parallel()
	uri := testenv.RabbitMQURL(t)
	queue := newQueue(t, uri, nil)
	wp, err := amqp.NewPublisher(amqpConfig(uri), watermill.NopLogger{})
	require.NoError(t, err)
	var up atomic.Bool
	up.Store(true)
	pub, err := asbroker.NewPublisher(wp, &asbroker.PublisherConfig{Concurrency: 1, Connected: up.Load})
	require.NoError(t, err)
	require.True(t, pub.Connected())
	up.Store(false)
	require.False(t, pub.Connected(), "down: the relay waits for the broker instead of counting attempts")
	plain, err := asbroker.NewPublisher(wp, nil)
	require.NoError(t, err)
	require.True(t, plain.Connected(), "without a probe every failure counts")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	msgs := []broker.Message{{ID: uuid.New(), Subject: queue}, {ID: uuid.New(), Subject: queue}}
	for i, r := range pub.Publish(ctx, msgs) {
		require.Equal(t, msgs[i].ID, r.ID)
		require.ErrorIs(t, r.Err, context.Canceled)
	}
	require.NoError(t, pub.Close(), "waits for what is still in flight")
	require.NoError(t, wp.Close())

	_, err = asbroker.NewPublisher(nil, nil)
	require.ErrorIs(t, err, asbroker.ErrInvalidConfig)
}
