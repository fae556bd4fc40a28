package natsjs_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
)

// When the durable consumer is deleted under a Source, JetStream ends the
// pull subscription; Receive reports that instead of blocking forever.
func TestSourceReportsDeletedConsumer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStreamSource(t, natsjs.SourceConfig{})
	n, name, src := s.nats, s.name, s.src
	res := s.pub.Publish(ctx, []broker.Message{{ID: uuid.New(), Subject: name + ".a", Payload: []byte("x")}})
	require.NoError(t, res[0].Err)

	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ds, err := src.Receive(rctx, 1)
	require.NoError(t, err)
	require.NoError(t, ds[0].Ack(ctx))

	require.NoError(t, n.JS.DeleteConsumer(ctx, name, "d"))
	_, err = src.Receive(rctx, 1)
	require.ErrorIs(t, err, jetstream.ErrConsumerDeleted)
	_, err = src.Receive(rctx, 1)
	require.ErrorIs(t, err, jetstream.ErrConsumerDeleted, "and keeps reporting it")
}
