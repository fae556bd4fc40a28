package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// bundle is one test's world: a fresh schema, a NATS server, a stream
// capturing Subject+".>", and an Outbox writing into the schema.
type bundle struct {
	db      *testenv.DB
	nats    *testenv.NATS
	stream  jetstream.Stream
	name    string
	subject string
	ob      *outbox.Outbox
}

func setup(t *testing.T) *bundle {
	t.Helper()
	return setupDB(t, testenv.NewDB(t))
}

// setupDB is setup on db.
func setupDB(t *testing.T, db *testenv.DB) *bundle {
	t.Helper()
	b := &bundle{db: db, nats: testenv.NewNATS(t), name: testenv.Name(t)}
	b.subject = b.name + ".ev"
	var err error
	b.stream, err = natsjs.EnsureStream(context.Background(), b.nats.JS, natsjs.StreamConfig{Name: b.name, Subjects: []string{b.subject + ".>"}})
	require.NoError(t, err)
	b.ob = newOutbox(t, b.db, outbox.Config{})
	return b
}

// msg returns an event for key, numbered i.
func (b *bundle) msg(key string, i int) broker.Message {
	return broker.Message{ID: uuid.New(), Subject: b.subject + ".x", Key: key, Payload: fmt.Appendf(nil, "%s/%d", key, i)}
}

// publisher connects like the daemon does: no buffering while disconnected.
func publisher(t *testing.T, url string) (*natsjs.Publisher, *nats.Conn) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.ReconnectBufSize(-1))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	pub, err := natsjs.NewPublisher(nc, nil)
	require.NoError(t, err)
	return pub, nc
}

// connectJS connects to url for the test's own reads.
func connectJS(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

// srvPort is the port of a nats:// URL.
func srvPort(t *testing.T, u string) int {
	t.Helper()
	pu, err := url.Parse(u)
	require.NoError(t, err)
	p, err := strconv.Atoi(pu.Port())
	require.NoError(t, err)
	return p
}

func testLogger() *slog.Logger {
	if os.Getenv("ONCEKIT_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// startRelay runs a relay until the test ends (or stop is called).
func (b *bundle) startRelay(t *testing.T, pub broker.Publisher, cfg outbox.RelayConfig) (stop func(), reg *prometheus.Registry) {
	t.Helper()
	reg = prometheus.NewRegistry()
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	cfg.Registerer = reg
	if cfg.Lease == 0 {
		cfg.Lease = 2 * time.Second
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 100 * time.Millisecond
	}
	r, err := outbox.NewRelay(b.db.Pool, b.ob, pub, &cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Error("relay did not stop")
			}
		})
	}
	t.Cleanup(stop)
	return stop, reg
}

// streamMsg is one message read back from the stream.
type streamMsg struct {
	id, key, payload string
}

// readStream returns every message of the stream in stream order.
func readStream(t *testing.T, s jetstream.Stream) []streamMsg {
	t.Helper()
	ctx := context.Background()
	info, err := s.Info(ctx)
	require.NoError(t, err)
	out := make([]streamMsg, 0, info.State.Msgs)
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		require.NoError(t, err)
		out = append(out, streamMsg{id: m.Header.Get(broker.HeaderMsgID), key: m.Header.Get(broker.HeaderKey), payload: string(m.Data)})
	}
	return out
}

func streamCount(t *testing.T, s jetstream.Stream) uint64 {
	t.Helper()
	info, err := s.Info(context.Background())
	if !assert.NoError(t, err) { // t.Errorf: safe in Eventually conditions
		return 0
	}
	return info.State.Msgs
}

// waitCount waits until the stream holds n messages.
func waitCount(t *testing.T, s jetstream.Stream, n uint64, within time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool { return streamCount(t, s) >= n }, within, 20*time.Millisecond,
		"stream should reach %d messages", n)
}

// requireExactlyOnceInOrder checks that the stream holds exactly the
// messages in want (each once, with its payload) and, per key, in want's
// order.
func requireExactlyOnceInOrder(t *testing.T, got []streamMsg, want []broker.Message) {
	t.Helper()
	require.Len(t, got, len(want), "stream count")
	seen := map[string]bool{}
	for _, m := range got {
		require.False(t, seen[m.id], "message %s twice", m.id)
		seen[m.id] = true
	}
	wantPayload := map[string]string{}
	perKey := map[string][]string{}
	for _, m := range want {
		wantPayload[m.ID.String()] = string(m.Payload)
		perKey[m.Key] = append(perKey[m.Key], m.ID.String())
	}
	for _, m := range got {
		p, ok := wantPayload[m.id]
		require.True(t, ok, "unexpected message %s", m.id)
		require.Equal(t, p, m.payload, "payload of %s", m.id)
	}
	gotKey := map[string][]string{}
	for _, m := range got {
		gotKey[m.key] = append(gotKey[m.key], m.id)
	}
	for k, ids := range perKey {
		if k == "" {
			continue
		}
		require.Equal(t, ids, gotKey[k], "order of key %q", k)
	}
}

func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	return testenv.Metric(t, reg, name, labels...)
}

// restartable is an in-process NATS server that a test stops and starts
// again on the same store and port, with the bundle's stream on it.
type restartable struct {
	t   *testing.T
	b   *bundle
	dir string
	url string
	srv *server.Server
}

// restartableBroker moves b's stream to an in-process server the test
// can stop and start again on the same store.
func restartableBroker(t *testing.T, b *bundle) *restartable {
	t.Helper()
	br := &restartable{t: t, b: b, dir: t.TempDir()}
	br.srv = testenv.StartServer(t, br.dir, -1)
	br.url = br.srv.ClientURL()
	var err error
	b.stream, err = natsjs.EnsureStream(context.Background(), connectJS(t, br.url), natsjs.StreamConfig{Name: b.name, Subjects: []string{b.subject + ".>"}})
	require.NoError(t, err)
	return br
}

// withRestartableBroker sets up a bundle whose stream lives on a
// restartable in-process server.
func withRestartableBroker(t *testing.T) (*bundle, *restartable) {
	t.Helper()
	b := &bundle{db: testenv.NewDB(t), name: testenv.Name(t)}
	b.subject = b.name + ".ev"
	b.ob = newOutbox(t, b.db, outbox.Config{})
	return b, restartableBroker(t, b)
}

// stop shuts the server down.
func (r *restartable) stop() {
	r.srv.Shutdown()
	r.srv.WaitForShutdown()
}

// start starts it again on the same store and port and reopens the stream.
func (r *restartable) start() {
	r.t.Helper()
	r.srv = testenv.StartServer(r.t, r.dir, srvPort(r.t, r.url))
	var err error
	r.b.stream, err = connectJS(r.t, r.srv.ClientURL()).Stream(context.Background(), r.b.name)
	require.NoError(r.t, err)
}

// backlog is the number of unpublished, unparked messages in b's outbox.
func backlog(t *testing.T, b *bundle) int64 {
	t.Helper()
	bl, err := b.ob.Backlog(context.Background(), b.db.Pool)
	assert.NoError(t, err) // t.Errorf: safe in Eventually conditions
	return bl.Pending
}

// publishedRows counts the rows behind their partition's cursor and not held.
func publishedRows(t *testing.T, db *testenv.DB) int {
	t.Helper()
	var n int
	assert.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox o
		JOIN relay_partitions p ON p.partition = o.partition
		WHERE (o.txid, o.seq) <= (p.cursor_txid, p.cursor_seq) AND o.parked_at IS NULL AND o.next_attempt_at IS NULL`).Scan(&n))
	return n
}

// setPartitions makes the schema's partition count n (the migrations make
// it 16): before any Enqueue or relay reads it.
func setPartitions(t *testing.T, db *testenv.DB, n int) {
	t.Helper()
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `DELETE FROM relay_partitions WHERE partition >= $1`, n)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO relay_partitions (partition) SELECT generate_series(0, $1::int - 1) ON CONFLICT DO NOTHING`, n)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `UPDATE outbox_epoch SET partitions = $1`, n)
	require.NoError(t, err)
}
