package natsjs_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/internal/testkit/chaos"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/internal/wait"
)

// A publish forwarded to a stream leader that dies is never answered: the
// publisher's own server stays up, so no reconnect fails it either. Its
// place in the publisher's window must come back all the same, or a few
// leader deaths leave a relay that can publish nothing. The test fills the
// window with publishes to a hung leader (a follower hung too, so that no
// other leader is elected meanwhile), kills it, and publishes again once a
// new leader is elected.
func TestPublisherWindowOutlivesAnUnansweredLeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs := startClusterStream(ctx, t)

	// The publisher's connection is to a follower, which forwards each
	// publish to the leader and stays up when the leader dies.
	const window = 16
	pub, err := natsjs.NewPublisher(connectNode(t, cs.c.URLs()[cs.through]), &natsjs.PublisherConfig{MaxPending: window, AckTimeout: 2 * time.Second})
	require.NoError(t, err)
	require.NoError(t, errors.Join(resultErrs(pub.Publish(ctx, cs.batch(window)))...), "before any fault")

	require.NoError(t, cs.c.Pause(cs.leader))
	require.NoError(t, cs.c.Pause(cs.follower))
	hung, stop := context.WithTimeout(ctx, time.Second)
	for _, r := range pub.Publish(hung, cs.batch(window)) {
		require.Error(t, r.Err, "a hung leader acknowledged a publish")
	}
	stop()
	require.NoError(t, cs.c.Kill(cs.leader))
	require.NoError(t, cs.c.Resume(cs.follower))
	streamLeader(ctx, t, cs.c, cs.stream, cs.c.ServerName(cs.leader))

	// Each attempt gets 5 s: a window still full of the dead leader's
	// publishes fails every one of them, waiting for room.
	var last error
	for attempt := 1; ; attempt++ {
		actx, stop := context.WithTimeout(ctx, 5*time.Second)
		rs := pub.Publish(actx, cs.batch(window))
		stop()
		if last = errors.Join(resultErrs(rs)...); last == nil {
			t.Logf("published a window's worth again at attempt %d", attempt)
			return
		}
		require.Less(t, attempt, 6, "the window never came back: %v", last)
	}
}

// A JetStream cluster that stops answering makes every publish time out.
// The publisher then lets fewer publishes wait at once, so a cluster too
// slow to answer is sent less as its callers retry, and lets as many as
// before again once acks come back. The test hangs the stream's leader and
// one follower (so that no new leader is elected), publishes three rounds
// through the third node, and publishes again once both run again.
func TestPublisherSendsLessToAClusterThatDoesNotAnswer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs := startClusterStream(ctx, t)

	const maxPending = 64
	pub, err := natsjs.NewPublisher(connectNode(t, cs.c.URLs()[cs.through]), &natsjs.PublisherConfig{MaxPending: maxPending, AckTimeout: time.Second})
	require.NoError(t, err)
	require.NoError(t, errors.Join(resultErrs(pub.Publish(ctx, cs.batch(maxPending)))...), "before any fault")
	require.Equal(t, maxPending, pub.InFlightLimit())

	require.NoError(t, cs.c.Pause(cs.leader))
	require.NoError(t, cs.c.Pause(cs.follower))
	// Each round sends what the limit lets through within 2.5 s, each
	// publish timing out 1 s after it was sent.
	var sent []int
	for range 3 {
		rctx, stop := context.WithTimeout(ctx, 2500*time.Millisecond)
		rs := pub.Publish(rctx, cs.batch(maxPending))
		stop()
		n := 0
		for _, r := range rs {
			require.Error(t, r.Err, "a hung cluster acknowledged a publish")
			if errors.Is(r.Err, jetstream.ErrAsyncPublishTimeout) {
				n++
			}
		}
		sent = append(sent, n)
	}
	t.Logf("publishes sent to the hung cluster and timed out, by round: %v; limit now %d", sent, pub.InFlightLimit())
	require.Equal(t, 16, pub.InFlightLimit(), "the limit after three flights of timeouts")
	require.Less(t, sent[1], sent[0], "the second round sent as many publishes to the hung cluster as the first")

	require.NoError(t, cs.c.Resume(cs.leader))
	require.NoError(t, cs.c.Resume(cs.follower))
	require.NoError(t, wait.Until(ctx, 100*time.Millisecond, func(ctx context.Context) error {
		pctx, stop := context.WithTimeout(ctx, 5*time.Second)
		defer stop()
		if err := errors.Join(resultErrs(pub.Publish(pctx, cs.batch(maxPending)))...); err != nil {
			return err
		}
		if n := pub.InFlightLimit(); n < maxPending {
			return fmt.Errorf("limit %d after a round acknowledged", n)
		}
		return nil
	}), "the limit never came back to MaxPending")
}

// clusterStream is a three-node NATS cluster with a stream of three
// replicas named for the test, and its nodes by role when it started.
type clusterStream struct {
	c                         *chaos.NATSCluster
	stream                    jetstream.Stream
	name                      string
	leader, follower, through int // through: the other follower
}

// startClusterStream starts t's cluster and stream, or skips t in -short.
func startClusterStream(ctx context.Context, t *testing.T) *clusterStream {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a three-node NATS cluster")
	}
	t.Parallel()
	c, err := chaos.StartNATSCluster(ctx, t.TempDir(), 3)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	name := testenv.Name(t)
	js, err := jetstream.New(connectNode(t, c.URLs()...))
	require.NoError(t, err)
	stream, err := natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Replicas: 3})
	require.NoError(t, err)
	leader := streamLeader(ctx, t, c, stream, "")
	return &clusterStream{c: c, stream: stream, name: name, leader: leader, follower: (leader + 1) % 3, through: (leader + 2) % 3}
}

// batch returns n new messages on the stream.
func (cs *clusterStream) batch(n int) []broker.Message {
	msgs := make([]broker.Message, n)
	for i := range msgs {
		msgs[i] = broker.Message{ID: uuid.New(), Subject: cs.name + ".e", Payload: []byte("x")}
	}
	return msgs
}

// connectNode connects to urls, reconnecting for ever.
func connectNode(t *testing.T, urls ...string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(strings.Join(urls, ","), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.Timeout(2*time.Second))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// streamLeader waits until stream has a leader other than not and returns
// its node's index.
func streamLeader(ctx context.Context, t *testing.T, c *chaos.NATSCluster, stream jetstream.Stream, not string) int {
	t.Helper()
	for {
		ictx, stop := context.WithTimeout(ctx, 2*time.Second)
		info, err := stream.Info(ictx)
		stop()
		if err == nil && info.Cluster != nil && info.Cluster.Leader != "" && info.Cluster.Leader != not {
			i := c.Node(info.Cluster.Leader)
			require.GreaterOrEqual(t, i, 0, "leader %q is not a node of the cluster", info.Cluster.Leader)
			return i
		}
		require.True(t, wait.Sleep(ctx, 200*time.Millisecond), "no stream leader other than %q: %v", not, err)
	}
}

func resultErrs(rs []broker.Result) []error {
	var errs []error
	for _, r := range rs {
		if r.Err != nil {
			errs = append(errs, r.Err)
		}
	}
	return errs
}
