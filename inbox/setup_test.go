package inbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// bundle is one test's PostgreSQL schema, JetStream stream and publisher.
type bundle struct {
	t       *testing.T
	db      *testenv.DB
	nats    *testenv.NATS
	stream  string
	subject string
	pub     *natsjs.Publisher
}

func setup(t *testing.T) *bundle {
	return setupStream(t, natsjs.StreamConfig{})
}

func setupStream(t *testing.T, sc natsjs.StreamConfig) *bundle {
	t.Helper()
	return setupOn(t, sc, testenv.NewDB(t))
}

// setupOn is setupStream on db.
func setupOn(t *testing.T, sc natsjs.StreamConfig, db *testenv.DB) *bundle {
	t.Helper()
	b := &bundle{t: t, db: db, nats: testenv.NewNATS(t)}
	b.stream = testenv.Name(t)
	b.subject = b.stream + ".events"
	sc.Name, sc.Subjects = b.stream, []string{b.stream + ".>"}
	_, err := natsjs.EnsureStream(context.Background(), b.nats.JS, sc)
	require.NoError(t, err)
	b.pub, err = natsjs.NewPublisher(b.nats.Conn, nil)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(context.Background(), `CREATE TABLE effects (
		id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		message_id uuid   NOT NULL,
		key        text   NOT NULL DEFAULT '',
		seq        int    NOT NULL DEFAULT 0,
		attempt    int    NOT NULL DEFAULT 0)`)
	require.NoError(t, err)
	return b
}

// source opens a Source on the durable (created on first use).
func (b *bundle) source(durable string, ackWait time.Duration) *natsjs.Source {
	b.t.Helper()
	src, err := natsjs.NewSource(context.Background(), b.nats.JS, &natsjs.SourceConfig{
		Stream: b.stream, Durable: durable, AckWait: ackWait,
	})
	require.NoError(b.t, err)
	b.t.Cleanup(src.Close)
	return src
}

// sourceOwnConn opens a Source on the durable over a connection of its own,
// as a second process would.
func (b *bundle) sourceOwnConn(durable string, ackWait time.Duration) *natsjs.Source {
	b.t.Helper()
	nc, err := nats.Connect(b.nats.URL)
	require.NoError(b.t, err)
	b.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(b.t, err)
	src, err := natsjs.NewSource(context.Background(), js, &natsjs.SourceConfig{
		Stream: b.stream, Durable: durable, AckWait: ackWait,
	})
	require.NoError(b.t, err)
	b.t.Cleanup(src.Close)
	return src
}

// msg builds a message with a fresh ID.
func (b *bundle) msg(key string, seq int) broker.Message {
	return broker.Message{ID: uuid.New(), Subject: b.subject, Key: key, Payload: []byte(fmt.Sprint(seq))}
}

// msgs builds n keyless messages, payloads 0 to n-1.
func (b *bundle) msgs(n int) []broker.Message {
	out := make([]broker.Message, n)
	for i := range out {
		out[i] = b.msg("", i)
	}
	return out
}

func (b *bundle) publish(msgs ...broker.Message) []broker.Result {
	b.t.Helper()
	res := b.pub.Publish(context.Background(), msgs)
	for _, r := range res {
		require.NoError(b.t, r.Err)
	}
	return res
}

// insertEffect is the business write every test handler makes.
func insertEffect(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
	var seq int
	_, _ = fmt.Sscan(string(msg.Payload), &seq)
	_, err := tx.Exec(ctx, `INSERT INTO effects (message_id, key, seq, attempt) VALUES ($1, $2, $3, $4)`,
		msg.ID, msg.Key, seq, msg.Attempt)
	return err
}

// config is a consumer config for tests: fast backoff, quiet logs.
func (b *bundle) config(name string) *inbox.Config {
	return &inbox.Config{
		Name:       name,
		Schema:     b.db.Schema,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		Registerer: prometheus.NewRegistry(),
		Logger:     testLogger(),
	}
}

// start runs a consumer until the test ends.
func (b *bundle) start(src broker.Source, h inbox.Handler, cfg *inbox.Config) *inbox.Consumer {
	b.t.Helper()
	return b.startOn(b.db.Pool, src, h, cfg)
}

// startOn runs a consumer on db until the test ends.
func (b *bundle) startOn(db oncekit.DB, src broker.Source, h inbox.Handler, cfg *inbox.Config) *inbox.Consumer {
	b.t.Helper()
	c, err := inbox.NewConsumer(db, src, h, cfg)
	require.NoError(b.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := c.Run(ctx); err != nil {
			b.t.Errorf("Run: %v", err)
		}
	}()
	b.t.Cleanup(func() { cancel(); wg.Wait() })
	return c
}

// effects returns how many effect rows each message ID has.
func (b *bundle) effects() map[uuid.UUID]int {
	b.t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT message_id, count(*) FROM effects GROUP BY message_id`)
	require.NoError(b.t, err)
	out := map[uuid.UUID]int{}
	var id uuid.UUID
	var n int
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil })
	require.NoError(b.t, err)
	return out
}

func (b *bundle) count(sql string, args ...any) int {
	b.t.Helper()
	var n int
	require.NoError(b.t, b.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// waitStats polls until cond holds for the consumer's stats.
func waitStats(t *testing.T, c *inbox.Consumer, cond func(inbox.Stats) bool) {
	t.Helper()
	require.Eventually(t, func() bool { return cond(c.Stats()) }, 30*time.Second, 10*time.Millisecond,
		"condition not met; stats: %+v", c.Stats())
}

// waitLockWaiter polls until some session waits for a lock on this test's
// processed_messages: a second delivery blocked behind an uncommitted claim.
func (b *bundle) waitLockWaiter() {
	b.t.Helper()
	pattern := "%" + `"` + b.db.Schema + `".processed_messages` + "%"
	require.Eventually(b.t, func() bool {
		var n int
		err := b.db.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1`, pattern).Scan(&n)
		return err == nil && n > 0
	}, 30*time.Second, 20*time.Millisecond)
}

func rawPublish(t *testing.T, js jetstream.JetStream, subject string, headers map[string]string, data []byte) {
	t.Helper()
	m := natsjs.NATSMsg(broker.Message{Subject: subject, Payload: data})
	m.Header = map[string][]string{}
	for k, v := range headers {
		m.Header.Set(k, v)
	}
	_, err := js.PublishMsg(context.Background(), m)
	require.NoError(t, err)
}

// lostProgress wraps a Source so that the consumer's in-progress signals
// never reach the broker, as when the consumer process stalls or loses the
// broker for longer than AckWait: the broker then redelivers messages that
// are still being processed.
type lostProgress struct{ broker.Source }

func (s lostProgress) Receive(ctx context.Context, max int) ([]broker.Delivery, error) {
	ds, err := s.Source.Receive(ctx, max)
	for i, d := range ds {
		ds[i] = noProgress{d}
	}
	return ds, err
}

type noProgress struct{ broker.Delivery }

func (noProgress) InProgress(context.Context) error { return nil }
