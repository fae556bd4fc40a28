package natsjs_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// publisherOn starts a server with a stream named after the test that
// captures name+"."+subject, and a publisher on it.
func publisherOn(t *testing.T, subject string, cfg *natsjs.PublisherConfig) (name string, stream jetstream.Stream, pub *natsjs.Publisher) {
	t.Helper()
	n := testenv.NewNATS(t)
	name = testenv.Name(t)
	stream, err := natsjs.EnsureStream(context.Background(), n.JS, natsjs.StreamConfig{Name: name, Subjects: []string{name + "." + subject}})
	require.NoError(t, err)
	pub, err = natsjs.NewPublisher(n.Conn, cfg)
	require.NoError(t, err)
	return name, stream, pub
}

func TestPublishBatchDedupsByID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := testenv.NewNATS(t)
	name := testenv.Name(t)
	stream, err := natsjs.EnsureStream(ctx, n.JS, natsjs.StreamConfig{Name: name, Subjects: []string{name + ".>"}})
	require.NoError(t, err)
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, natsjs.DefaultDuplicates, info.Config.Duplicates)

	pub, err := natsjs.NewPublisher(n.Conn, nil)
	require.NoError(t, err)
	msgs := make([]broker.Message, 100)
	for i := range msgs {
		msgs[i] = broker.Message{ID: uuid.New(), Subject: name + ".e", Key: "k", Payload: []byte{byte(i)}, Headers: map[string]string{"X-A": "1"}}
	}
	for _, r := range pub.Publish(ctx, msgs) {
		require.NoError(t, r.Err)
		require.False(t, r.Duplicate)
	}
	// Publishing the same batch again is absorbed by the dedup window.
	for _, r := range pub.Publish(ctx, msgs) {
		require.NoError(t, r.Err)
		require.True(t, r.Duplicate)
	}
	info, err = stream.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 100, info.State.Msgs)

	got, err := stream.GetMsg(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, msgs[0].ID.String(), got.Header.Get(broker.HeaderMsgID))
	require.Equal(t, "k", got.Header.Get(broker.HeaderKey))
	require.Equal(t, "1", got.Header.Get("X-A"))
}

func TestPublishReportsPerMessageErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name, _, pub := publisherOn(t, "ok", nil)
	res := pub.Publish(ctx, []broker.Message{
		{ID: uuid.New(), Subject: name + ".ok"},
		{ID: uuid.New(), Subject: name + ".nostream"}, // no stream captures it
	})
	require.NoError(t, res[0].Err)
	require.ErrorIs(t, res[1].Err, jetstream.ErrNoStreamResponse)
}

func TestEnsureStreamValidates(t *testing.T) {
	t.Parallel()
	n := testenv.NewNATS(t)
	_, err := natsjs.EnsureStream(context.Background(), n.JS, natsjs.StreamConfig{Subjects: []string{"x"}})
	require.ErrorIs(t, err, natsjs.ErrInvalidConfig)
	require.EqualError(t, err, "natsjs: StreamConfig.Name: required")
	_, err = natsjs.EnsureStream(context.Background(), n.JS, natsjs.StreamConfig{Name: "x"})
	require.ErrorIs(t, err, natsjs.ErrInvalidConfig)
	_, err = natsjs.EnsureStream(context.Background(), n.JS, natsjs.StreamConfig{Name: "x", Subjects: []string{"x"}, Replicas: -1})
	require.ErrorIs(t, err, natsjs.ErrInvalidConfig)
	require.EqualError(t, err, "natsjs: StreamConfig.Replicas: -1 is negative")
	_, err = n.JS.Stream(context.Background(), "x")
	require.Error(t, err, "nothing was created")
}

func TestNewPublisherRefusesANegativeMaxPending(t *testing.T) {
	t.Parallel()
	n := testenv.NewNATS(t)
	_, err := natsjs.NewPublisher(n.Conn, &natsjs.PublisherConfig{MaxPending: -1})
	require.ErrorIs(t, err, natsjs.ErrInvalidConfig)
	require.EqualError(t, err, "natsjs: PublisherConfig.MaxPending: -1 is negative")
}

func TestPublishBatchLargerThanWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name, stream, pub := publisherOn(t, ">", &natsjs.PublisherConfig{MaxPending: 16})
	msgs := make([]broker.Message, 2000)
	for i := range msgs {
		msgs[i] = broker.Message{ID: uuid.New(), Subject: name + ".e"}
	}
	for _, r := range pub.Publish(ctx, msgs) {
		require.NoError(t, r.Err)
	}
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2000, info.State.Msgs)
	require.True(t, pub.Connected())
}

func TestPublishChainSkipsAfterAFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name, stream, pub := publisherOn(t, "ok", nil)
	msg := func(subject string) broker.Message {
		return broker.Message{ID: uuid.New(), Subject: name + "." + subject}
	}
	// Chain a: ok → ok; chain b: bad → ok (must not be sent); c: alone.
	msgs := []broker.Message{msg("ok"), msg("bad"), msg("ok"), msg("ok"), msg("ok")}
	prev := []int{-1, -1, 0, 1, -1}
	res := pub.PublishChain(ctx, msgs, prev)
	require.NoError(t, res[0].Err)
	require.Error(t, res[1].Err)
	require.NoError(t, res[2].Err)
	require.ErrorIs(t, res[3].Err, natsjs.ErrNotSent)
	require.NoError(t, res[4].Err)
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, info.State.Msgs)
	first, err := stream.GetMsg(ctx, 1)
	require.NoError(t, err)
	second, err := stream.GetMsg(ctx, 3)
	require.NoError(t, err)
	require.Equal(t, msgs[0].ID.String(), first.Header.Get(broker.HeaderMsgID))
	require.Equal(t, msgs[2].ID.String(), second.Header.Get(broker.HeaderMsgID), "a chain keeps its order")
}
