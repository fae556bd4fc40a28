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
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

func TestSourceDeliversWithMetadataAndLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := testenv.NewNATS(t)
	name := testenv.Name(t)
	_, err := natsjs.EnsureStream(ctx, n.JS, natsjs.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Duplicates: time.Minute})
	require.NoError(t, err)
	src, err := natsjs.NewSource(ctx, n.JS, &natsjs.SourceConfig{Stream: name, Durable: "d", AckWait: 2 * time.Second, MaxDeliver: 50})
	require.NoError(t, err)
	defer src.Close()

	l, err := src.Limits(ctx)
	require.NoError(t, err)
	require.Equal(t, broker.SourceLimits{AckWait: 2 * time.Second, MaxDeliver: 50, Duplicates: time.Minute}, l)

	pub, err := natsjs.NewPublisher(n.Conn, nil)
	require.NoError(t, err)
	id := uuid.New()
	res := pub.Publish(ctx, []broker.Message{{ID: id, Subject: name + ".a", Key: "k", Payload: []byte("x")}})
	require.NoError(t, res[0].Err)

	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ds, err := src.Receive(rctx, 10)
	require.NoError(t, err)
	require.Len(t, ds, 1)
	d := ds[0]
	require.Equal(t, id.String(), d.Header(broker.HeaderMsgID))
	require.Equal(t, "k", d.Header(broker.HeaderKey))
	require.Equal(t, name+".a", d.Subject())
	require.Equal(t, 1, d.Attempt())
	require.NoError(t, d.Nak(ctx, 0))

	ds, err = src.Receive(rctx, 10) // redelivered at once
	require.NoError(t, err)
	require.Equal(t, 2, ds[0].Attempt())
	require.NoError(t, ds[0].Ack(ctx))

	src.Close()
	_, err = src.Receive(rctx, 1)
	require.ErrorIs(t, err, broker.ErrSourceClosed)
}

func TestNewSourceValidates(t *testing.T) {
	t.Parallel()
	n := testenv.NewNATS(t)
	_, err := natsjs.NewSource(context.Background(), n.JS, &natsjs.SourceConfig{Durable: "d"})
	require.ErrorIs(t, err, natsjs.ErrInvalidConfig)
	require.EqualError(t, err, "natsjs: SourceConfig.Stream: required")
	_, err = natsjs.NewSource(context.Background(), n.JS, &natsjs.SourceConfig{Stream: "s"})
	require.ErrorIs(t, err, natsjs.ErrInvalidConfig)
	require.EqualError(t, err, "natsjs: SourceConfig.Durable: required")
	// A negative value is refused, not taken for the default (nor, for
	// MaxAckPending, for JetStream's "unlimited").
	_, err = natsjs.NewSource(context.Background(), n.JS, &natsjs.SourceConfig{Stream: "s", Durable: "d", MaxAckPending: -1})
	require.ErrorIs(t, err, natsjs.ErrInvalidConfig)
	require.EqualError(t, err, "natsjs: SourceConfig.MaxAckPending: -1 is negative")
}

func TestSourceMustExistAndDeliverPolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := testenv.NewNATS(t)
	name := testenv.Name(t)
	_, err := natsjs.EnsureStream(ctx, n.JS, natsjs.StreamConfig{Name: name, Subjects: []string{name + ".>"}})
	require.NoError(t, err)
	pub, err := natsjs.NewPublisher(n.Conn, nil)
	require.NoError(t, err)
	old := uuid.New()
	require.NoError(t, pub.Publish(ctx, []broker.Message{{ID: old, Subject: name + ".a"}})[0].Err)

	// A missing durable is refused, not created from the start of the stream.
	_, err = natsjs.NewSource(ctx, n.JS, &natsjs.SourceConfig{Stream: name, Durable: "d", MustExist: true})
	require.ErrorIs(t, err, natsjs.ErrDurableNotFound)
	_, err = n.JS.Consumer(ctx, name, "d")
	require.Error(t, err, "nothing was created")

	// Created once at deployment, starting with new messages only.
	first, err := natsjs.NewSource(ctx, n.JS, &natsjs.SourceConfig{Stream: name, Durable: "d", DeliverPolicy: jetstream.DeliverNewPolicy})
	require.NoError(t, err)
	first.Close()
	src, err := natsjs.NewSource(ctx, n.JS, &natsjs.SourceConfig{Stream: name, Durable: "d", MustExist: true})
	require.NoError(t, err, "an existing durable keeps its start position")
	defer src.Close()
	fresh := uuid.New()
	require.NoError(t, pub.Publish(ctx, []broker.Message{{ID: fresh, Subject: name + ".a"}})[0].Err)
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ds, err := src.Receive(rctx, 10)
	require.NoError(t, err)
	require.Len(t, ds, 1)
	require.Equal(t, fresh.String(), ds[0].Header(broker.HeaderMsgID), "the message older than the durable is not delivered")
	require.NoError(t, ds[0].Ack(ctx))
}
