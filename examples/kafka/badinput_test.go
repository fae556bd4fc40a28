package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/examples/kafka/kafkabroker"
	"github.com/oncekit/oncekit/examples/kafka/kafkatest"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/oncekittest"
	"github.com/oncekit/oncekit/outbox"
)

var quiet = slog.New(slog.DiscardHandler)

// world is a cluster, a topic of four partitions on it, and a database
// with an effects table the consumers write.
type world struct {
	brokers []string
	topic   string
	db      *testenv.DB
	ob      *outbox.Outbox
	cfg     kafkabroker.Config
}

func newWorld(t *testing.T, opts ...kfake.Opt) *world {
	_, brokers := kafkatest.New(t, opts...)
	w := &world{brokers: brokers, topic: kafkatest.Topic(t, brokers, 4), db: testenv.NewDB(t),
		cfg: kafkabroker.Config{Brokers: brokers, Group: "billing", SessionTimeout: testSession}}
	_, err := w.db.Pool.Exec(context.Background(), `CREATE TABLE effects (event_id uuid NOT NULL)`)
	require.NoError(t, err)
	w.ob, err = outbox.New(&outbox.Config{Schema: w.db.Schema})
	require.NoError(t, err)
	return w
}

func (w *world) enqueue(t *testing.T, msgs ...broker.Message) {
	ctx := context.Background()
	tx, err := w.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = w.ob.Enqueue(ctx, tx, msgs...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
}

func (w *world) msg(key string, payload []byte) broker.Message {
	return broker.Message{ID: uuid.New(), Subject: w.topic, Key: key, Payload: payload}
}

// startRelay runs a relay that parks a message after three failed
// publishes, until stop or the test's end.
func (w *world) startRelay(t *testing.T) (stop func()) {
	pub, err := kafkabroker.NewPublisher(w.cfg)
	require.NoError(t, err)
	r, err := outbox.NewRelay(w.db.Pool, w.ob, pub, &outbox.RelayConfig{MaxAttempts: 3, PollInterval: 20 * time.Millisecond,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, PublishTimeout: 5 * time.Second, Logger: quiet})
	require.NoError(t, err)
	stopRun := oncekittest.Start(t, r.Run)
	stop = sync.OnceFunc(func() { stopRun(); _ = pub.Close() })
	t.Cleanup(stop)
	return stop
}

// startConsumer runs a consumer of the group whose handler records each
// event, after calling hold (if not nil) with it.
func (w *world) startConsumer(t *testing.T, hold func(*inbox.Message)) (*inbox.Consumer, func()) {
	src, err := kafkabroker.NewSource(context.Background(), w.cfg, w.topic)
	require.NoError(t, err)
	c, err := inbox.NewConsumer(w.db.Pool, src, inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		if hold != nil {
			hold(msg)
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (event_id) VALUES ($1)`, msg.ID)
		return err
	}), &inbox.Config{Name: "billing", Schema: w.db.Schema, BatchSize: 16, Logger: quiet})
	require.NoError(t, err)
	stop := oncekittest.Start(t, c.Run)
	stopAll := func() { stop(); src.Close() }
	t.Cleanup(stopAll)
	return c, stopAll
}

// applied waits until the events of ids are applied, then checks each once
// and nothing else.
func (w *world) applied(t *testing.T, ids ...uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	var total, distinct, want int
	require.Eventually(t, func() bool {
		require.NoError(t, w.db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id), count(*) FILTER (WHERE event_id = ANY($1)) FROM effects`, ids).
			Scan(&total, &distinct, &want))
		return want >= len(ids)
	}, 60*time.Second, 20*time.Millisecond, "applied %d of %d", want, len(ids))
	require.Equal(t, len(ids), want, "each once")
	require.Equal(t, total, distinct, "no event twice")
	require.Equal(t, len(ids), total, "nothing else")
}

// parked waits until the event id is parked and returns its entry.
func (w *world) parked(t *testing.T, id uuid.UUID) outbox.Entry {
	t.Helper()
	var e outbox.Entry
	require.Eventually(t, func() bool {
		es, err := w.ob.List(context.Background(), w.db.Pool, outbox.ListOptions{State: outbox.StateParked})
		require.NoError(t, err)
		for _, x := range es {
			if x.ID == id {
				e = x
				return true
			}
		}
		return false
	}, 60*time.Second, 20*time.Millisecond)
	return e
}

// A broker down at start: both constructors fail within seconds with
// ErrUnreachable, naming the addresses.
func TestBrokerDownAtStart(t *testing.T) {
	t.Parallel()
	c, brokers := kafkatest.New(t)
	c.Close()
	cfg := kafkabroker.Config{Brokers: brokers, Group: "billing"}
	start := time.Now()
	_, err := kafkabroker.NewPublisher(cfg)
	require.ErrorIs(t, err, kafkabroker.ErrUnreachable)
	require.Contains(t, err.Error(), brokers[0])
	t.Logf("publisher: %v after %s", err, time.Since(start).Round(time.Millisecond))
	start = time.Now()
	_, err = kafkabroker.NewSource(context.Background(), cfg, "payments")
	require.ErrorIs(t, err, kafkabroker.ErrUnreachable)
	t.Logf("source: %v after %s", err, time.Since(start).Round(time.Millisecond))
	require.Less(t, time.Since(start), 15*time.Second)
}

// A topic missing (the cluster creates none): the relay parks the message
// after MaxAttempts with the broker's error, the other keys go through, and
// once the topic exists an unpark delivers it, once.
func TestTopicMissingParksTheMessage(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	bad := w.msg("k1", []byte("1"))
	bad.Subject = w.topic + ".missing"
	good := []broker.Message{w.msg("k2", []byte("1")), w.msg("k3", []byte("1"))}
	w.enqueue(t, append([]broker.Message{bad}, good...)...)
	stopRelay := w.startRelay(t)
	w.startConsumer(t, nil)

	e := w.parked(t, bad.ID)
	require.Equal(t, 3, e.Attempts, "parked after MaxAttempts, no loop")
	require.Contains(t, e.LastError, "topic", "the broker's error is kept")
	t.Logf("parked after %d attempts: %s", e.Attempts, e.LastError)
	w.applied(t, good[0].ID, good[1].ID)

	// A source on a topic that does not exist fails at once.
	_, err := kafkabroker.NewSource(context.Background(), w.cfg, bad.Subject)
	require.ErrorIs(t, err, kafkabroker.ErrTopicMissing)
	t.Logf("source on the missing topic: %v", err)

	// The topic created and the relay restarted (sarama's producer keeps
	// the topic's circuit breaker open for 10 s after three failures to
	// find its partitions), an unpark delivers the message, once.
	stopRelay()
	require.NoError(t, kafkatest.CreateTopic(w.brokers, bad.Subject, 1))
	n, err := w.ob.Unpark(context.Background(), w.db.Pool, bad.ID)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	w.startRelay(t)
	require.Eventually(t, func() bool {
		b, err := w.ob.Backlog(context.Background(), w.db.Pool)
		n, err2 := w.ob.ParkedCount(context.Background(), w.db.Pool)
		return err == nil && err2 == nil && b.Pending == 0 && n == 0
	}, 30*time.Second, 20*time.Millisecond, "published after the unpark")
}

// A message over the broker's message.max.bytes: refused by the broker
// (MESSAGE_TOO_LARGE), parked after MaxAttempts; its neighbours, even of its
// own key before it, are applied; nothing loops.
func TestMessageOverMaxBytesParks(t *testing.T) {
	t.Parallel()
	w := newWorld(t, kfake.BrokerConfigs(map[string]string{"message.max.bytes": "16384"}))
	before := w.msg("k1", []byte("1"))
	big := w.msg("k1", []byte(strings.Repeat("x", 32<<10)))
	other := w.msg("k2", []byte("1"))
	w.enqueue(t, before, big, other)
	w.startRelay(t)
	w.startConsumer(t, nil)

	e := w.parked(t, big.ID)
	require.Equal(t, 3, e.Attempts)
	require.Contains(t, strings.ToLower(e.LastError), "too large")
	t.Logf("parked after %d attempts: %s", e.Attempts, e.LastError)
	w.applied(t, before.ID, other.ID)
	n, err := w.ob.ParkedCount(context.Background(), w.db.Pool)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
}

// A rebalance in the middle of a batch: a consumer holds a batch, its
// first message mid-handler, when a second one joins the group; later the
// first leaves while at work. Partitions move both times with messages in
// hand (acked after the move, so their offsets are not committed and the
// new owner gets them again): every event is applied once.
func TestRebalanceMidBatch(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	var ids []uuid.UUID
	batch := func(n int) {
		var msgs []broker.Message
		for i := range n {
			m := w.msg(fmt.Sprintf("k%d", i%8), []byte("1"))
			msgs = append(msgs, m)
			ids = append(ids, m.ID)
		}
		w.enqueue(t, msgs...)
	}
	batch(300)
	w.startRelay(t)
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	a, stopA := w.startConsumer(t, func(*inbox.Message) {
		once.Do(func() { close(held); <-release })
	})
	<-held
	b, _ := w.startConsumer(t, nil) // joins: the group rebalances
	close(release)
	ctx := context.Background()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, w.db.Pool.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&n))
		return n >= 150
	}, 60*time.Second, 10*time.Millisecond)
	stopA() // leaves mid-stream
	batch(50)
	w.applied(t, ids...)
	sa, sb := a.Stats(), b.Stats()
	t.Logf("first consumer: %d processed, %d duplicates; second: %d processed, %d duplicates", sa.Processed, sa.Duplicates, sb.Processed, sb.Duplicates)
	require.Positive(t, sb.Processed, "the second consumer got partitions")
}
