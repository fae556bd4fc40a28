package brokertests_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/watermill/asbroker"
)

// Watermill keeps no ack timer; the Source does: a delivery left unsettled
// past AckWait is handed back and comes again, and InProgress holds it.
func TestSourceAckWait(t *testing.T) {
	t.Parallel()
	uri := testenv.RabbitMQURL(t)
	queue := newQueue(t, uri, nil)
	pub, closePub, err := newPublisher("rabbitmq", uri)
	require.NoError(t, err)
	defer closePub()
	const ackWait = 500 * time.Millisecond
	src, closeSrc, err := newSource("rabbitmq", uri, queue, &asbroker.SourceConfig{AckWait: ackWait})
	require.NoError(t, err)
	defer closeSrc()
	l, err := src.Limits(context.Background())
	require.NoError(t, err)
	require.Equal(t, broker.SourceLimits{AckWait: ackWait, MaxDeliver: -1}, l)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kept, left := uuid.New(), uuid.New()
	require.NoError(t, pub.Publish(ctx, []broker.Message{{ID: kept, Subject: queue}})[0].Err)

	// Kept in progress for four ack waits: not handed back.
	ds, err := src.Receive(ctx, 1)
	require.NoError(t, err)
	for deadline := time.Now().Add(4 * ackWait); time.Now().Before(deadline); {
		require.NoError(t, ds[0].InProgress(ctx))
		wctx, wcancel := context.WithTimeout(ctx, ackWait/3)
		_, err := src.Receive(wctx, 1) // also the pause between signals
		wcancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "nothing else comes while the message is held")
	}
	require.NoError(t, ds[0].Ack(ctx))

	// Left alone: handed back after the ack wait and delivered again.
	require.NoError(t, pub.Publish(ctx, []broker.Message{{ID: left, Subject: queue}})[0].Err)
	first, err := src.Receive(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, left.String(), first[0].Header(broker.HeaderEventID))
	start := time.Now()
	again, err := src.Receive(ctx, 1)
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(start), ackWait-50*time.Millisecond)
	require.Equal(t, left.String(), again[0].Header(broker.HeaderEventID))
	require.Equal(t, 2, again[0].Attempt())
	require.NoError(t, again[0].Ack(ctx))
	require.NoError(t, first[0].Ack(ctx), "a late ack of the handed-back delivery is ignored")

	_, err = asbroker.NewSource(ctx, nil, &asbroker.SourceConfig{Topics: []string{queue}})
	require.ErrorIs(t, err, asbroker.ErrInvalidConfig)
}
