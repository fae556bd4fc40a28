package natsjs_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
)

// What ordered consumers ask of the source: deliveries numbered in the
// stream and among the durable's deliveries, the headers of the durable's
// messages read from the stream in order (other subjects skipped), and the
// ack floor.
func TestSourceScansTheStreamForOrderedConsumers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStreamSource(t, natsjs.SourceConfig{AckWait: 5 * time.Second}, "a")
	name, src := s.name, s.src
	var msgs []broker.Message
	for i, subject := range []string{"a", "b", "a", "a", "b", "a"} { // stream sequences 1 to 6
		msgs = append(msgs, broker.Message{ID: uuid.New(), Subject: name + "." + subject, Key: "k" + string(rune('0'+i)), Payload: []byte("x")})
	}
	for _, r := range s.pub.Publish(ctx, msgs) {
		require.NoError(t, r.Err)
	}

	floor, err := src.AckFloor(ctx)
	require.NoError(t, err)
	require.Zero(t, floor)

	scan := func(from, to uint64) (seqs []uint64, keys []string) {
		t.Helper()
		got, err := src.Scan(ctx, from, to)
		require.NoError(t, err)
		for _, m := range got {
			seqs = append(seqs, m.Sequence)
			keys = append(keys, m.Headers[broker.HeaderKey][0])
		}
		return seqs, keys
	}
	seqs, keys := scan(1, 3)
	require.Equal(t, []uint64{1, 3}, seqs)
	require.Equal(t, []string{"k0", "k2"}, keys)
	// On from where it stopped; past the stream's end it returns what
	// there is instead of waiting.
	seqs, _ = scan(4, 100)
	require.Equal(t, []uint64{4, 6}, seqs)
	// Backwards: it starts over.
	seqs, _ = scan(2, 4)
	require.Equal(t, []uint64{3, 4}, seqs)

	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var got []broker.Delivery
	for len(got) < 4 {
		ds, err := src.Receive(rctx, 4)
		require.NoError(t, err)
		got = append(got, ds...)
	}
	for i, want := range []uint64{1, 3, 4, 6} {
		sd, ok := got[i].(broker.SequencedDelivery)
		require.True(t, ok)
		msg, delivery := sd.Sequence()
		require.Equal(t, want, msg)
		require.Equal(t, uint64(i+1), delivery, "the durable numbers its deliveries consecutively")
	}
	require.NoError(t, got[0].Ack(ctx))
	require.NoError(t, got[2].Ack(ctx))
	require.Eventually(t, func() bool {
		floor, err := src.AckFloor(ctx)
		return err == nil && floor == 2
	}, 10*time.Second, 20*time.Millisecond, "the floor stops just below the first unacked message, 3")
	require.NoError(t, got[1].Ack(ctx))
	require.Eventually(t, func() bool {
		floor, err := src.AckFloor(ctx)
		return err == nil && floor == 5
	}, 10*time.Second, 20*time.Millisecond, "acked up to 4, and 5 is not the durable's")
}
