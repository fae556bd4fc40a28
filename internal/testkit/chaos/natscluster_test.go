package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/wait"
)

// connectCluster connects to every node with the reconnect options the
// NATSCluster doc comment recommends.
func connectCluster(t *testing.T, c *NATSCluster) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(strings.Join(c.URLs(), ","),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond),
		nats.ReconnectJitter(50*time.Millisecond, 0),
		nats.RetryOnFailedConnect(true),
		nats.Timeout(2*time.Second))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// publishUntilAcked publishes id with Nats-Msg-Id = id, retrying with the
// same ID until JetStream acknowledges it; it returns the ack and the number
// of attempts.
func publishUntilAcked(ctx context.Context, t *testing.T, js jetstream.JetStream, id string) (*jetstream.PubAck, int) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ack, err := js.Publish(actx, "chaos.pay", []byte(id), jetstream.WithMsgID(id))
		cancel()
		if err == nil {
			return ack, attempt
		}
		// During an election the survivors answer "no response from
		// stream" at once: back off a little before the next attempt.
		require.Truef(t, wait.Sleep(ctx, 100*time.Millisecond), "publish %s: gave up after %d attempts, last error %v", id, attempt, err)
	}
}

// untilAnswered calls create, an idempotent JetStream API request, until it
// is answered, waiting at most 15 s for each answer. On a cluster just
// formed, and on a loaded machine, such a request can go unanswered for good
// (the new stream's or consumer's group elects its leader after the client
// stopped listening): one attempt bounded only by ctx would wait for all of it.
func untilAnswered[T any](ctx context.Context, create func(context.Context) (T, error)) (T, error) {
	for {
		actx, cancel := context.WithTimeout(ctx, 15*time.Second)
		v, err := create(actx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return v, err
		}
		if !wait.Sleep(ctx, 200*time.Millisecond) {
			return v, err
		}
	}
}

// consumed is the set of message IDs a consumer received, with counts.
type consumed struct {
	mu  sync.Mutex
	ids map[string]int
}

func (c *consumed) add(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ids[id]++
}

func (c *consumed) has(ids []string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		if c.ids[id] == 0 {
			return false
		}
	}
	return true
}

func TestNATSClusterSurvivesStreamLeaderKill(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := StartNATSCluster(ctx, t.TempDir(), 3)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	require.NoError(t, c.Healthy(ctx))

	nc := connectCluster(t, c)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	stream, err := untilAnswered(ctx, func(ctx context.Context) (jetstream.Stream, error) {
		return js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
			Name: "CHAOS", Subjects: []string{"chaos.>"}, Replicas: 3, Storage: jetstream.FileStorage,
			Duplicates: 5 * time.Minute,
		})
	})
	require.NoError(t, err)
	cons, err := untilAnswered(ctx, func(ctx context.Context) (jetstream.Consumer, error) {
		return stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable: "ledger", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second,
		})
	})
	require.NoError(t, err)

	// A consumer reads and acks for the whole test, through whichever nodes
	// are up; pull errors during the election are expected and retried.
	got := &consumed{ids: map[string]int{}}
	consumeCtx, stopConsume := context.WithCancel(ctx)
	var consumerDone sync.WaitGroup
	consumerDone.Add(1)
	go func() {
		defer consumerDone.Done()
		for consumeCtx.Err() == nil {
			batch, err := cons.Fetch(50, jetstream.FetchMaxWait(500*time.Millisecond))
			if err != nil {
				continue
			}
			for msg := range batch.Messages() {
				got.add(msg.Headers().Get(jetstream.MsgIDHeader))
				_ = msg.Ack()
			}
		}
	}()
	defer func() { stopConsume(); consumerDone.Wait() }()

	var published []string
	publish := func(from, to int) (retried int) {
		for i := from; i < to; i++ {
			id := fmt.Sprintf("pay-%03d", i)
			ack, attempts := publishUntilAcked(ctx, t, js, id)
			retried += attempts - 1
			require.Falsef(t, ack.Duplicate && attempts == 1, "%s: first publish reported a duplicate", id)
			published = append(published, id)
		}
		return retried
	}
	publish(0, 50)

	info, err := stream.Info(ctx)
	require.NoError(t, err)
	leader := c.Node(info.Cluster.Leader)
	require.GreaterOrEqual(t, leader, 0, "stream leader %q is not a node", info.Cluster.Leader)
	require.NoError(t, c.Kill(leader))
	require.Error(t, c.Healthy(ctx), "a killed node is reported healthy")
	killed := time.Now()
	retried := publish(50, 100)
	t.Logf("stream leader %s killed: 50 publishes through the survivors took %v, %d retries", info.Cluster.Leader, time.Since(killed).Round(time.Millisecond), retried)

	restarted := time.Now()
	require.NoError(t, c.Restart(ctx, leader))
	t.Logf("node %s back and caught up in %v", info.Cluster.Leader, time.Since(restarted).Round(time.Millisecond))
	publish(100, 120)
	require.NoError(t, poll(ctx, c.Healthy))

	// No acknowledged message lost: the consumer saw every one, and the
	// stream holds each exactly once although timed-out publishes were
	// retried.
	require.NoError(t, poll(ctx, func(context.Context) error {
		if !got.has(published) {
			return fmt.Errorf("consumer has not seen every published message")
		}
		return nil
	}))
	info, err = stream.Info(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, len(published), info.State.Msgs, "stream holds a message twice or lost one")

	// Dedup still holds after the failover: republishing acknowledged IDs is
	// reported as a duplicate and stores nothing.
	for _, id := range []string{"pay-000", "pay-075", "pay-119"} {
		ack, _ := publishUntilAcked(ctx, t, js, id)
		assert.Truef(t, ack.Duplicate, "%s republished after the failover was stored again", id)
	}
	info, err = stream.Info(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, len(published), info.State.Msgs)

	// The restarted node is a current replica again.
	require.NoError(t, poll(ctx, func(ctx context.Context) error {
		info, err := stream.Info(ctx)
		if err != nil {
			return err
		}
		peers := append([]*jetstream.PeerInfo{{Name: info.Cluster.Leader, Current: true}}, info.Cluster.Replicas...)
		for _, p := range peers {
			if p.Name == c.ServerName(leader) && p.Current && !p.Offline {
				return nil
			}
		}
		return fmt.Errorf("node %s is not a current replica: %+v", c.ServerName(leader), info.Cluster)
	}))
}
