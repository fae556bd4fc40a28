package natsjs_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
)

// publishN publishes n messages to the stream's subject name.a.
func (s *streamSource) publishN(t *testing.T, n int) {
	t.Helper()
	msgs := make([]broker.Message, n)
	for i := range msgs {
		msgs[i] = broker.Message{ID: uuid.New(), Subject: s.name + ".a", Payload: fmt.Appendf(nil, "%d", i)}
	}
	for _, r := range s.pub.Publish(context.Background(), msgs) {
		require.NoError(t, r.Err)
	}
}

// info is the durable's state.
func (s *streamSource) info(t *testing.T) *jetstream.ConsumerInfo {
	t.Helper()
	ctx := context.Background()
	cons, err := s.nats.JS.Consumer(ctx, s.name, "d")
	require.NoError(t, err)
	ci, err := cons.Info(ctx)
	require.NoError(t, err)
	return ci
}

// A consumer slower than its prefetch: what the Source holds for it (far
// more than it handles within AckWait) is kept in progress, so JetStream
// redelivers none of it. Each message is received once, at its first
// delivery, and JetStream redelivered nothing.
func TestSourceKeepsWhatItHoldsInProgress(t *testing.T) {
	t.Parallel()
	const ackWait, n = 2 * time.Second, 200
	s := newStreamSource(t, natsjs.SourceConfig{AckWait: ackWait})
	s.publishN(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	seen := map[string]int{}
	start := time.Now()
	for len(seen) < n {
		ds, err := s.src.Receive(ctx, 1)
		require.NoError(t, err)
		d := ds[0]
		id := d.Header(broker.HeaderMsgID)
		seen[id]++
		require.Equal(t, 1, seen[id], "message %s received again, %v after the start", id, time.Since(start))
		require.Equal(t, 1, d.Attempt(), "message %s redelivered", id)
		time.Sleep(25 * time.Millisecond) // the consumer's work: 200 messages take 2.5 AckWaits
		require.NoError(t, d.Ack(ctx))
	}
	require.Greater(t, time.Since(start), 2*ackWait, "the consumer was as slow as meant")
	require.Equal(t, uint64(n), s.info(t).Delivered.Consumer, "deliveries of %d messages: JetStream redelivered what the Source held", n)
}

// Closing a Source hands what it holds back to JetStream at once: another
// process of the durable receives it without waiting for AckWait.
func TestSourceCloseHandsBackWhatItHolds(t *testing.T) {
	t.Parallel()
	const n = 100
	s := newStreamSource(t, natsjs.SourceConfig{AckWait: time.Minute})
	s.publishN(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ds, err := s.src.Receive(ctx, 1)
	require.NoError(t, err)
	require.NoError(t, ds[0].Ack(ctx))
	require.Eventually(t, func() bool { return s.info(t).NumAckPending == n-1 }, 10*time.Second, 5*time.Millisecond,
		"the Source prefetched the rest")
	s.src.Close()

	other, err := natsjs.NewSource(ctx, s.nats.JS, &natsjs.SourceConfig{Stream: s.name, Durable: "d", AckWait: time.Minute})
	require.NoError(t, err)
	defer other.Close()
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second) // AckWait is a minute
	defer rcancel()
	got := 0
	for got < n-1 {
		ds, err := other.Receive(rctx, n)
		require.NoError(t, err, "%d of %d handed back", got, n-1)
		for _, d := range ds {
			require.NoError(t, d.Ack(ctx))
		}
		got += len(ds)
	}
	require.Equal(t, n-1, got)
}
