package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/internal/crashpoint"
	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// logicalCluster is a PostgreSQL cluster with wal_level=logical, started
// once for the package's logical relay tests (the shared server's
// wal_level is not theirs to change) and stopped by TestMain.
var logicalCluster struct {
	once sync.Once
	pg   *pgcluster.Cluster
	err  error
}

func stopLogicalCluster() {
	if logicalCluster.pg != nil {
		logicalCluster.pg.Close()
	}
}

// logicalSetup is setup on the logical cluster, its Outbox writing into
// the WAL (Config.Logical).
func logicalSetup(t *testing.T) *bundle {
	t.Helper()
	logicalCluster.once.Do(func() {
		dir, err := os.MkdirTemp("", "oncekit-logical-")
		if err != nil {
			logicalCluster.err = err
			return
		}
		logicalCluster.pg, logicalCluster.err = pgcluster.Start(context.Background(), pgcluster.Options{LogDir: dir,
			Settings: "wal_level = logical\nmax_replication_slots = 40\nmax_wal_senders = 40\nmax_connections = 300\nfsync = off\n"})
	})
	if errors.Is(logicalCluster.err, pgcluster.ErrNoPostgres) {
		t.Skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
	}
	require.NoError(t, logicalCluster.err)
	b := setupDB(t, testenv.NewDBOn(t, logicalCluster.pg.URL("postgres")))
	b.ob = newOutbox(t, b.db, outbox.Config{Logical: true})
	require.NoError(t, b.ob.SetUpLogical(context.Background(), b.db.Pool))
	t.Cleanup(func() { // a slot holds WAL back until dropped
		_, _ = b.db.Pool.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
			WHERE slot_name = $1 AND NOT active`, "oncekit_"+b.db.Schema)
	})
	return b
}

// startLogicalRelay runs a logical relay until the test ends (or stop is
// called).
func (b *bundle) startLogicalRelay(t *testing.T, pub broker.Publisher, cfg outbox.LogicalRelayConfig) (stop func(), reg *prometheus.Registry) {
	t.Helper()
	reg = prometheus.NewRegistry()
	cfg.Logger, cfg.Registerer = testLogger(), reg
	cfg.StatusInterval = max(cfg.StatusInterval, 200*time.Millisecond)
	cfg.Table.Lease, cfg.Table.PollInterval = 2*time.Second, 100*time.Millisecond
	r, err := outbox.NewLogicalRelay(b.db.Pool, b.ob, pub, &cfg)
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
				t.Error("logical relay did not stop")
			}
		})
	}
	t.Cleanup(stop)
	return stop, reg
}

// slotConfirmed is the slot's confirmed position.
func slotConfirmed(t *testing.T, b *bundle) pglogrepl.LSN {
	t.Helper()
	var s *string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, "oncekit_"+b.db.Schema).Scan(&s))
	if s == nil {
		return 0
	}
	lsn, err := pglogrepl.ParseLSN(*s)
	require.NoError(t, err)
	return lsn
}

func currentLSN(t *testing.T, b *bundle) pglogrepl.LSN {
	t.Helper()
	var s string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&s))
	lsn, err := pglogrepl.ParseLSN(s)
	require.NoError(t, err)
	return lsn
}

// Messages enqueued into the WAL reach the stream once each, each key's in
// order, from writers committing concurrently while the relay streams; the
// outbox table holds nothing, before or after. With a publisher that
// cannot chain, in waves.
func TestLogicalRelayPublishesEachKeyInOrder(t *testing.T) {
	t.Parallel()
	t.Run("chained", func(t *testing.T) {
		t.Parallel()
		testLogicalKeyOrder(t, func(p *natsjs.Publisher) broker.Publisher { return p })
	})
	t.Run("waves", func(t *testing.T) {
		t.Parallel()
		testLogicalKeyOrder(t, func(p *natsjs.Publisher) broker.Publisher { return plainPublisher{p} })
	})
}

func testLogicalKeyOrder(t *testing.T, wrap func(*natsjs.Publisher) broker.Publisher) {
	b := logicalSetup(t)
	pub, _ := publisher(t, b.nats.URL)
	b.startLogicalRelay(t, wrap(pub), outbox.LogicalRelayConfig{})
	const writers, perWriter, keysPerWriter = 4, 150, 5
	var mu sync.Mutex
	var want []broker.Message
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter / 3 {
				var tx []broker.Message
				for j := range 3 { // three messages a transaction, of two keys
					tx = append(tx, b.msg(fmt.Sprintf("w%d-k%d", w, (i+j/2)%keysPerWriter), 3*i+j))
				}
				enqueue(t, b.db, b.ob, tx...)
				mu.Lock()
				want = append(want, tx...)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	waitCount(t, b.stream, writers*perWriter, 30*time.Second)
	requireExactlyOnceInOrder(t, readStream(t, b.stream), want)
	var rows int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT (SELECT count(*) FROM outbox) + (SELECT count(*) FROM outbox_published)`).Scan(&rows))
	require.Zero(t, rows, "the outbox tables grow by nothing")
}

// The slot's position moves past what the broker acknowledged and no
// further: with the broker down, the events committed meanwhile stay
// unconfirmed (PostgreSQL keeps them), and a new relay publishes them once
// the broker is back, each once.
func TestLogicalRelayConfirmsOnlyAcknowledgedEvents(t *testing.T) {
	t.Parallel()
	b := logicalSetup(t)
	br := restartableBroker(t, b)
	pub, _ := publisher(t, br.url)
	stop, reg := b.startLogicalRelay(t, pub, outbox.LogicalRelayConfig{PublishTimeout: 500 * time.Millisecond})

	var want []broker.Message
	for i := range 20 {
		m := b.msg("k", i)
		enqueue(t, b.db, b.ob, m)
		want = append(want, m)
	}
	waitCount(t, b.stream, 20, 20*time.Second)
	first := currentLSN(t, b)
	require.Eventually(t, func() bool { return slotConfirmed(t, b) >= first }, 20*time.Second, 20*time.Millisecond,
		"the acknowledged events are confirmed")

	br.stop()
	for i := 20; i < 40; i++ {
		m := b.msg("k", i)
		enqueue(t, b.db, b.ob, m)
		want = append(want, m)
	}
	committed := currentLSN(t, b)
	require.Eventually(t, func() bool {
		return metricValue(t, reg, "oncekit_outbox_logical_publish_failures_total") >= 3
	}, 30*time.Second, 20*time.Millisecond, "the relay tried and failed")
	require.Less(t, slotConfirmed(t, b), committed, "nothing the broker did not acknowledge is confirmed")
	stop()

	br.start()
	pub2, _ := publisher(t, br.url)
	b.startLogicalRelay(t, pub2, outbox.LogicalRelayConfig{})
	waitCount(t, b.stream, 40, 30*time.Second)
	requireExactlyOnceInOrder(t, readStream(t, b.stream), want)
}

// Two relays of one slot: one streams, the other stands by; when the first
// stops, the second takes the lease and the slot over from where it was
// confirmed.
func TestLogicalRelayStandbyTakesOver(t *testing.T) {
	t.Parallel()
	b := logicalSetup(t)
	pub, _ := publisher(t, b.nats.URL)
	stop1, _ := b.startLogicalRelay(t, pub, outbox.LogicalRelayConfig{})
	var want []broker.Message
	send := func(from, to int) {
		for i := from; i < to; i++ {
			m := b.msg(fmt.Sprintf("k%d", i%3), i)
			enqueue(t, b.db, b.ob, m)
			want = append(want, m)
		}
	}
	send(0, 30)
	waitCount(t, b.stream, 30, 20*time.Second)
	_, reg2 := b.startLogicalRelay(t, pub, outbox.LogicalRelayConfig{})
	require.Eventually(t, func() bool { return metricValue(t, reg2, "oncekit_outbox_logical_standby") == 1 },
		20*time.Second, 20*time.Millisecond, "the second relay stands by")
	send(30, 60)
	stop1()
	send(60, 90)
	waitCount(t, b.stream, 90, 30*time.Second)
	require.Zero(t, metricValue(t, reg2, "oncekit_outbox_logical_standby"))
	requireExactlyOnceInOrder(t, readStream(t, b.stream), want)
}

// A message the broker refuses (its subject is in no stream) while it takes
// the others is parked in the outbox table after MaxAttempts, its key's
// later messages behind it there, and everything else goes on. With a
// publisher that cannot chain, in waves.
func TestLogicalRelayParksARefusedMessage(t *testing.T) {
	t.Parallel()
	t.Run("chained", func(t *testing.T) {
		t.Parallel()
		testLogicalParks(t, func(p *natsjs.Publisher) broker.Publisher { return p })
	})
	t.Run("waves", func(t *testing.T) {
		t.Parallel()
		testLogicalParks(t, func(p *natsjs.Publisher) broker.Publisher { return plainPublisher{p} })
	})
}

func testLogicalParks(t *testing.T, wrap func(*natsjs.Publisher) broker.Publisher) {
	b := logicalSetup(t)
	pub, _ := publisher(t, b.nats.URL)
	_, reg := b.startLogicalRelay(t, wrap(pub), outbox.LogicalRelayConfig{MaxAttempts: 3, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	bad := b.msg("stuck", 0)
	bad.Subject = "nowhere." + b.name
	behind := b.msg("stuck", 1)
	var good []broker.Message
	for i := range 10 {
		good = append(good, b.msg(fmt.Sprintf("k%d", i), i))
	}
	enqueue(t, b.db, b.ob, append([]broker.Message{bad, behind}, good...)...)
	waitCount(t, b.stream, 10, 20*time.Second)
	require.Eventually(t, func() bool { return metricValue(t, reg, "oncekit_outbox_logical_parked_total") == 1 },
		20*time.Second, 20*time.Millisecond)
	more := b.msg("k0", 99)
	enqueue(t, b.db, b.ob, more)
	waitCount(t, b.stream, 11, 20*time.Second)

	var parked, held int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE parked_at IS NOT NULL AND id = $1),
		count(*) FILTER (WHERE parked_at IS NULL AND id = $2) FROM outbox`, bad.ID, behind.ID).Scan(&parked, &held))
	require.Equal(t, 1, parked, "the refused message is parked")
	require.Equal(t, 1, held, "its key's next message waits behind it, in the table")
	for _, m := range readStream(t, b.stream) {
		require.NotEqual(t, behind.ID.String(), m.id, "nothing of the parked key overtakes it")
	}
}

// With nothing of its own to publish, the relay still moves the slot with
// the server's position, so that an idle schema's slot does not hold back
// the WAL other writers make.
func TestLogicalRelayIdleSlotFollowsTheServer(t *testing.T) {
	t.Parallel()
	b := logicalSetup(t)
	pub, _ := publisher(t, b.nats.URL)
	b.startLogicalRelay(t, pub, outbox.LogicalRelayConfig{})
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `CREATE TABLE busy (n int)`)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return slotConfirmed(t, b) > 0 }, 20*time.Second, 20*time.Millisecond)
	for range 20 {
		_, err := b.db.Pool.Exec(ctx, `INSERT INTO busy SELECT generate_series(1, 1000)`)
		require.NoError(t, err)
	}
	written := currentLSN(t, b)
	require.Eventually(t, func() bool { return slotConfirmed(t, b) >= written }, 30*time.Second, 20*time.Millisecond,
		"the slot follows the server while the relay has nothing to publish")
}

// Enqueue into the WAL refuses while the slot does not exist: PostgreSQL
// would never decode what it wrote for a slot made later.
func TestLogicalEnqueueNeedsTheSlot(t *testing.T) {
	t.Parallel()
	b := logicalSetup(t)
	ob := newOutbox(t, b.db, outbox.Config{Logical: true, Slot: "not_set_up"})
	err := pgx.BeginFunc(context.Background(), b.db.Pool, func(tx pgx.Tx) error {
		_, err := ob.Enqueue(context.Background(), tx, b.msg("k", 0))
		return err
	})
	require.ErrorIs(t, err, outbox.ErrNoSlot)
	require.Equal(t, 1, enqueue(t, b.db, b.ob, b.msg("k", 1)).Inserted, "the set-up slot takes messages")
}

// A relay process killed after JetStream acknowledged a round and before
// it confirmed the slot's position: PostgreSQL sends the round again to the
// next relay, JetStream's deduplication absorbs it, and every message is in
// the stream once, each key's in order.
func TestLogicalRelayProcessKilledAfterPublishBeforeConfirm(t *testing.T) {
	t.Parallel()
	b := logicalSetup(t)
	br := restartableBroker(t, b)
	var want []broker.Message
	for i := range 30 {
		var tx []broker.Message
		for j := range 10 {
			tx = append(tx, b.msg(fmt.Sprintf("k%d", (i+j)%7), 10*i+j))
		}
		enqueue(t, b.db, b.ob, tx...)
		want = append(want, tx...)
	}
	committed := currentLSN(t, b)

	p := startRelayProc(t, b, br.url, []string{crashpoint.EnvVar + "=logical.after-publish"}, "--logical")
	p.wait(t, 60*time.Second)
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "killed at the crash point: %v\n%s", p.err, p.out.String())
	published := streamCount(t, b.stream)
	require.NotZero(t, published, "the round reached the broker")
	require.Less(t, slotConfirmed(t, b), committed, "the round was not confirmed")

	// The broker restarts too (same store, same port); its dedup state
	// survives, so the round sent again is absorbed.
	br.stop()
	br.start()
	startRelayProc(t, b, br.url, nil, "--logical")
	waitCount(t, b.stream, uint64(len(want)), 60*time.Second)
	requireExactlyOnceInOrder(t, readStream(t, b.stream), want)
	require.Eventually(t, func() bool { return slotConfirmed(t, b) >= committed }, 30*time.Second, 20*time.Millisecond)
}

// Another writer's messages under the outbox's prefix, which Enqueue did
// not write (hostile bytes: not the format, NUL, invalid UTF-8, a length
// past the end, 100 KB of noise), are skipped, counted and logged; the
// events around them, in the same transactions, are published once each.
func TestLogicalRelaySkipsForeignMessagesUnderItsPrefix(t *testing.T) {
	t.Parallel()
	b := logicalSetup(t)
	pub, _ := publisher(t, b.nats.URL)
	_, reg := b.startLogicalRelay(t, pub, outbox.LogicalRelayConfig{})
	ctx := context.Background()
	hostile := [][]byte{
		{}, {0x00}, []byte("\xff\xfe not ours"), {1, 0, 0}, // too short, or our version byte and no ID
		append(append([]byte{1}, make([]byte, 16)...), 0xff, 0xff, 0xff, 0xff, 0x0f), // a key length past the end
		append(append([]byte{1}, make([]byte, 16)...), 0, 0, 3, '{', 0, 0xff),        // headers that are not JSON
		bytes.Repeat([]byte{0xff, 0x00}, 50000),
	}
	var want []broker.Message
	for i, h := range hostile {
		m := b.msg("k", i)
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, $1, $2::bytea)`, "oncekit.outbox."+b.db.Schema, h); err != nil {
				return err
			}
			_, err := b.ob.Enqueue(ctx, tx, m)
			return err
		}))
		want = append(want, m)
	}
	waitCount(t, b.stream, uint64(len(want)), 20*time.Second)
	requireExactlyOnceInOrder(t, readStream(t, b.stream), want)
	require.Equal(t, float64(len(hostile)), metricValue(t, reg, "oncekit_outbox_logical_undecodable_total"))
}
