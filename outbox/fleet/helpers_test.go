package fleet_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/outbox/fleet"
)

// world is one test's fleet: a NATS server, a stream capturing subject+".>",
// a bucket of its own, and a publisher that records every acknowledgement.
type world struct {
	nats    *testenv.NATS
	js      jetstream.JetStream
	pub     *recorder
	stream  jetstream.Stream
	name    string
	subject string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{nats: testenv.NewNATS(t), name: testenv.Name(t)}
	w.subject = w.name + ".ev"
	var err error
	w.stream, err = natsjs.EnsureStream(context.Background(), w.nats.JS, natsjs.StreamConfig{Name: w.name, Subjects: []string{w.subject + ".>"}})
	require.NoError(t, err)
	nc, err := nats.Connect(w.nats.URL, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.ReconnectBufSize(-1))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	inner, err := natsjs.NewPublisher(nc, nil)
	require.NoError(t, err)
	w.js, err = jetstream.New(nc)
	require.NoError(t, err)
	w.pub = &recorder{inner: inner, acks: map[uuid.UUID]int{}, first: map[uuid.UUID]time.Time{}}
	return w
}

// config is a fleet configuration fast enough for tests.
func (w *world) config(id string) fleet.Config {
	return fleet.Config{
		ID:              id,
		Bucket:          w.name,
		Replicas:        2,
		MemberTTL:       1500 * time.Millisecond,
		ApplicationName: w.name,
		ConnectTimeout:  time.Second,
		MinBackoff:      100 * time.Millisecond,
		MaxBackoff:      time.Second,
		Relay: outbox.RelayConfig{
			Lease:        2 * time.Second,
			PollInterval: 50 * time.Millisecond,
		},
		Logger: testLogger(),
	}
}

// member is a running fleet member.
type member struct {
	f    *fleet.Fleet
	reg  *prometheus.Registry
	stop func()
}

// start runs a member with cfg (its Registerer set to a fresh registry)
// serving dbs, until stop or the test's end.
func (w *world) start(t *testing.T, cfg fleet.Config, dbs ...fleet.Database) *member {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	f, err := fleet.New(w.js, w.pub, &cfg)
	require.NoError(t, err)
	require.NoError(t, f.Set(dbs))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Error("fleet member did not stop")
			}
		})
	}
	t.Cleanup(stop)
	return &member{f: f, reg: reg, stop: stop}
}

// outboxDB is a fresh schema with the migrations applied, as a fleet
// database named name.
type outboxDB struct {
	db  *testenv.DB
	ob  *outbox.Outbox
	def fleet.Database
}

func newOutboxDB(t *testing.T, name string) *outboxDB {
	t.Helper()
	db := testenv.NewDB(t)
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	return &outboxDB{db: db, ob: ob, def: fleet.Database{Name: name, URL: db.URL, Schema: db.Schema}}
}

// enqueue commits n events of key into d and returns them.
func (w *world) enqueue(t *testing.T, d *outboxDB, key string, n int) []broker.Message {
	t.Helper()
	msgs, err := w.tryEnqueue(d, key, n)
	require.NoError(t, err)
	return msgs
}

// tryEnqueue is enqueue for goroutines other than the test's.
func (w *world) tryEnqueue(d *outboxDB, key string, n int) ([]broker.Message, error) {
	msgs := make([]broker.Message, n)
	for i := range msgs {
		msgs[i] = broker.Message{ID: uuid.New(), Subject: w.subject + "." + d.def.Name, Key: key, Payload: fmt.Appendf(nil, "%s/%d", key, i)}
	}
	err := pgx.BeginFunc(context.Background(), d.db.Pool, func(tx pgx.Tx) error {
		_, err := d.ob.Enqueue(context.Background(), tx, msgs...)
		return err
	})
	return msgs, err
}

// recorder is a Publisher that counts the broker's acknowledgements of
// each message ID (a second one is a second publication, whatever the
// broker's dedup window makes of it) and when the first came.
type recorder struct {
	inner broker.Publisher
	mu    sync.Mutex
	acks  map[uuid.UUID]int
	first map[uuid.UUID]time.Time
}

func (r *recorder) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	res := r.inner.Publish(ctx, msgs)
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, x := range res {
		if x.Err == nil {
			r.acks[x.ID]++
			if _, ok := r.first[x.ID]; !ok {
				r.first[x.ID] = now
			}
		}
	}
	return res
}

// published reports how many of msgs were acknowledged.
func (r *recorder) published(msgs []broker.Message) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range msgs {
		if r.acks[m.ID] > 0 {
			n++
		}
	}
	return n
}

// waitPublished waits until every one of msgs was acknowledged.
func (r *recorder) waitPublished(t *testing.T, msgs []broker.Message, within time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool { return r.published(msgs) == len(msgs) }, within, 20*time.Millisecond,
		"%d of %d messages published", r.published(msgs), len(msgs))
}

// requireOnce checks that each of msgs was acknowledged exactly once.
func (r *recorder) requireOnce(t *testing.T, msgs []broker.Message) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		require.Equal(t, 1, r.acks[m.ID], "acknowledgements of %s", m.ID)
	}
}

// requireStoredOnce checks that the stream holds each of msgs once and
// nothing else. A publish JetStream deduplicated (a batch published again
// by a relay that could not record it) is acknowledged twice and stored
// once: that is the contract, which the recorder's count of acks is
// stricter than.
func (w *world) requireStoredOnce(t *testing.T, msgs []broker.Message) {
	t.Helper()
	seen := map[string]int{}
	info, err := w.stream.Info(context.Background())
	require.NoError(t, err)
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := w.stream.GetMsg(context.Background(), seq)
		require.NoError(t, err)
		seen[m.Header.Get(broker.HeaderMsgID)]++
	}
	for _, m := range msgs {
		require.Equal(t, 1, seen[m.ID.String()], "event %s in the stream", m.ID)
	}
	require.Len(t, seen, len(msgs), "nothing else in the stream")
}

func testLogger() *slog.Logger {
	if os.Getenv("ONCEKIT_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// nopPublisher is a Publisher for tests that publish nothing.
type nopPublisher struct{}

func (nopPublisher) Publish(context.Context, []broker.Message) []broker.Result { return nil }
