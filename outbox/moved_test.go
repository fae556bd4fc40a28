package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// withoutRebaseEnv, set to 1, runs TestRestoredClusterPublishesEveryEventOnce
// as the relay did before the check and Rebase existed (the check off, no
// rebase): it then fails, reporting the events missing.
const withoutRebaseEnv = "ONCEKIT_TEST_WITHOUT_REBASE"

// countingPublisher counts what the broker acknowledged and, of that, what
// it recognised as a copy (JetStream's duplicate window absorbed it). It
// keeps the chained path of natsjs.Publisher.
type countingPublisher struct {
	*natsjs.Publisher
	acked, dups atomic.Int64
}

func (p *countingPublisher) count(res []broker.Result) []broker.Result {
	for _, r := range res {
		if r.Err == nil {
			p.acked.Add(1)
			if r.Duplicate {
				p.dups.Add(1)
			}
		}
	}
	return res
}

func (p *countingPublisher) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	return p.count(p.Publisher.Publish(ctx, msgs))
}

func (p *countingPublisher) PublishChain(ctx context.Context, msgs []broker.Message, prev []int) []broker.Result {
	return p.count(p.Publisher.PublishChain(ctx, msgs, prev))
}

// refusingPublisher is the old cluster's broker: it refuses the messages of
// one key (they are held, and their key's later ones behind them), and
// acknowledges at most budget others (negative: no limit), refusing the
// rest. It has no PublishChain: the relay publishes in waves.
type refusingPublisher struct {
	pub    *natsjs.Publisher
	key    string
	budget atomic.Int64
}

func (p *refusingPublisher) Connected() bool { return p.pub.Connected() }

func (p *refusingPublisher) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	res := make([]broker.Result, len(msgs))
	var send []broker.Message
	var at []int
	for i, m := range msgs {
		if m.Key == p.key || p.budget.Load() == 0 {
			res[i].Err = errors.New("refused")
			continue
		}
		if p.budget.Load() > 0 {
			p.budget.Add(-1)
		}
		send, at = append(send, m), append(at, i)
	}
	for j, r := range p.pub.Publish(ctx, send) {
		res[at[j]] = r
	}
	return res
}

// events writes numbered events of keys, one transaction each, and
// remembers them in writing order (each key written by one goroutine, so
// that its order is its commit order).
type events struct {
	mu   sync.Mutex
	want []broker.Message
	next map[string]int
}

func (e *events) write(t *testing.T, b *bundle, pool *pgxpool.Pool, ob *outbox.Outbox, keys []string, perKey int) {
	t.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, len(keys))
	for half := range 2 { // two writers, each its own keys
		wg.Go(func() {
			for range perKey {
				for i, k := range keys {
					if i%2 != half {
						continue
					}
					e.mu.Lock()
					m := b.msg(k, e.next[k])
					e.next[k]++
					e.mu.Unlock()
					if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						_, err := ob.Enqueue(ctx, tx, m)
						return err
					}); err != nil {
						errs <- err
						return
					}
					e.mu.Lock()
					e.want = append(e.want, m)
					e.mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// runRelay runs a relay on pool until stop, which returns Run's error;
// done receives it should Run return on its own.
func runRelay(t *testing.T, pool *pgxpool.Pool, ob *outbox.Outbox, pub broker.Publisher) (stop func() error, done <-chan error) {
	t.Helper()
	r, err := outbox.NewRelay(pool, ob, pub, &outbox.RelayConfig{Lease: 2 * time.Second, PollInterval: 100 * time.Millisecond,
		BatchSize: 50, Logger: testLogger()})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	result := make(chan error, 1)
	go func() { err := r.Run(ctx); ran <- err; result <- err }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-ran:
			case <-time.After(30 * time.Second):
				runErr = errors.New("relay did not stop")
			}
		})
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return stop, result
}

// runTool runs one of PostgreSQL's client programs.
func runTool(t *testing.T, path string, args ...string) {
	t.Helper()
	out, err := exec.Command(path, args...).CombinedOutput()
	require.NoError(t, err, "%s: %s", filepath.Base(path), out)
}

// TestRestoredClusterPublishesEveryEventOnce restores a pg_dump of a
// producing database into a fresh cluster mid-stream. On the old cluster
// (its transaction IDs in epoch 5, as a cluster that has run for years)
// writers enqueue while the relay publishes part; the dump is taken; the
// old relay goes on publishing a while after it (those events are
// published again from the new cluster: JetStream's duplicate window
// absorbs them); the dump is restored into a new cluster, whose
// transaction IDs start far below the stored cursors; writers continue
// there. The relay refuses to run (ErrClusterMoved) until Rebase, run while
// writers keep writing; then every event is in the stream exactly once,
// each key in its order.
func TestRestoredClusterPublishesEveryEventOnce(t *testing.T) {
	ctx := context.Background()
	legacy := os.Getenv(withoutRebaseEnv) == "1"
	if legacy {
		outbox.SkipMovedCheck(true)
		t.Cleanup(func() { outbox.SkipMovedCheck(false) })
	}
	settings := pgcluster.Options{Settings: "fsync = off\nmax_connections = 100\n"}
	oldPG := pgcluster.StartForTest(ctx, t, settings)
	require.NoError(t, oldPG.SetXIDEpoch(ctx, 5))
	newPG := pgcluster.StartForTest(ctx, t, settings)

	b := setupDB(t, testenv.NewDBOn(t, oldPG.URL("postgres")))
	keys := make([]string, 20)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%02d", i)
	}
	keys[len(keys)-1] = "held" // refused on the old cluster
	ev := &events{next: map[string]int{}}
	pub, _ := publisher(t, b.nats.URL)

	// The old cluster: the relay publishes while writers write, then stops
	// behind them; its broker refuses the key "held".
	refusing := &refusingPublisher{pub: pub, key: "held"}
	refusing.budget.Store(-1)
	stopOld, _ := runRelay(t, b.db.Pool, b.ob, refusing)
	ev.write(t, b, b.db.Pool, b.ob, keys, 15) // 300
	waitCount(t, b.stream, 200, 30*time.Second)
	require.NoError(t, stopOld())
	ev.write(t, b, b.db.Pool, b.ob, keys, 15) // 600: the last ones unpublished
	atDump := streamCount(t, b.stream)

	dump := filepath.Join(t.TempDir(), "outbox.dump")
	runTool(t, oldPG.Tool("pg_dump"), "-Fc", "-n", b.db.Schema, "-f", dump, oldPG.URL("postgres"))

	// The old relay publishes 150 more after the dump: the new cluster's
	// dump says they are unpublished.
	refusing.budget.Store(150)
	stopOld, _ = runRelay(t, b.db.Pool, b.ob, refusing)
	waitCount(t, b.stream, atDump+150, 30*time.Second)
	require.NoError(t, stopOld())
	beforeNew := streamCount(t, b.stream)
	enqueuedOld := len(ev.want)

	// The new cluster.
	runTool(t, newPG.Tool("pg_restore"), "-d", newPG.URL("postgres"), dump)
	pool, err := pgxpool.New(ctx, newPG.URL("postgres")+"&search_path="+b.db.Schema)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var oldNext, newNext string
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text`).Scan(&oldNext))
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text`).Scan(&newNext))
	t.Logf("next transaction ID: old cluster %s, new cluster %s", oldNext, newNext)

	ev.write(t, b, pool, b.ob, keys, 5) // written before anything is done about the move

	counting := &countingPublisher{Publisher: pub}
	if !legacy {
		_, done := runRelay(t, pool, b.ob, counting)
		var err error
		select {
		case err = <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("the relay on the restored cluster did not stop")
		}
		var moved *outbox.ClusterMovedError
		require.ErrorAs(t, err, &moved, "the relay runs on the restored cluster")
		require.ErrorIs(t, err, outbox.ErrClusterMoved)
		t.Logf("relay on the restored cluster: %v", err)
		require.Zero(t, counting.acked.Load(), "published before the rebase")

		// Writers keep writing while the cursors move.
		var wg sync.WaitGroup
		wg.Go(func() { ev.write(t, b, pool, b.ob, keys, 5) })
		res, err := b.ob.Rebase(ctx, pool)
		require.NoError(t, err)
		wg.Wait()
		t.Logf("rebase: %+v", res)
		require.True(t, res.Moved)
		require.Equal(t, int(outbox.DefaultPartitions), res.Partitions)
		require.NotZero(t, res.Published)
		require.NotZero(t, res.Held)
		require.NotZero(t, res.Pending)
		require.NotZero(t, res.New)

		again, err := b.ob.Rebase(ctx, pool)
		require.NoError(t, err)
		require.False(t, again.Moved, "a second rebase changes nothing")
	}
	ev.write(t, b, pool, b.ob, keys, 5) // after the rebase

	stopNew, _ := runRelay(t, pool, b.ob, counting)
	want := ev.want
	deadline := time.Now().Add(60 * time.Second)
	if legacy {
		deadline = time.Now().Add(10 * time.Second)
	}
	for time.Now().Before(deadline) && streamCount(t, b.stream) < uint64(len(want)) {
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(t, stopNew())

	got := readStream(t, b.stream)
	seen := map[string]int{}
	for _, m := range got {
		seen[m.id]++
	}
	missing, twice := 0, 0
	for _, m := range want {
		switch seen[m.ID.String()] {
		case 0:
			missing++
		case 1:
		default:
			twice++
		}
	}
	t.Logf("enqueued %d (%d on the old cluster, %d on the new); in the stream %d before the new relay, %d after; "+
		"the new relay published %d, of which JetStream's duplicate window absorbed %d; missing %d, in the stream twice %d",
		len(want), enqueuedOld, len(want)-enqueuedOld, beforeNew, len(got), counting.acked.Load(), counting.dups.Load(), missing, twice)
	require.Zero(t, missing, "events missing from the stream")
	require.NotZero(t, counting.dups.Load(), "the events the old relay published after the dump come again")
	requireExactlyOnceInOrder(t, got, want)
}

// When the rows to order after the cursor need more transaction IDs than a
// fresh cluster has produced, Rebase consumes the difference first and
// keeps their order.
func TestRebaseMakesRoomBelowTheXmin(t *testing.T) {
	ctx := context.Background()
	pg := pgcluster.StartForTest(ctx, t, pgcluster.Options{Settings: "fsync = off\n"})
	db := testenv.NewDBOn(t, pg.URL("postgres"))
	ob := newOutbox(t, db, outbox.Config{})
	// 3,000 unpublished rows of partition 0 from an old cluster, each of
	// its own transaction, in reverse seq order; the cursor before them.
	const n = 3000
	_, err := db.Pool.Exec(ctx, `INSERT INTO outbox (id, txid, partition, ordering_key, subject, payload)
		SELECT gen_random_uuid(), (21474836480 + $1 - i)::text::xid8, 0, 'k', 'a.b', int4send(i)
		FROM generate_series(1, $1) i`, n)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `UPDATE relay_partitions SET cursor_txid = '21474836480', cursor_seq = 0`)
	require.NoError(t, err)
	var xmin int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::int8`).Scan(&xmin))
	require.Less(t, xmin, int64(n), "the fresh cluster has fewer transaction IDs than the rows need")

	res, err := ob.Rebase(ctx, db.Pool)
	require.NoError(t, err)
	t.Logf("xmin %d before; rebase: %+v", xmin, res)
	require.True(t, res.Moved)
	require.Positive(t, res.BurnedXIDs)
	require.EqualValues(t, n, res.Pending)

	var ahead bool
	var order []int32
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM outbox WHERE txid >= pg_snapshot_xmin(pg_current_snapshot())),
		array(SELECT (get_byte(payload, 0) << 24) | (get_byte(payload, 1) << 16) | (get_byte(payload, 2) << 8) | get_byte(payload, 3)
			FROM outbox ORDER BY txid, seq)`).Scan(&ahead, &order))
	require.False(t, ahead, "every row below the xmin")
	require.Len(t, order, n)
	for i, v := range order {
		require.EqualValues(t, n-i, v, "the rows keep their (txid, seq) order")
	}
	entries, err := ob.List(ctx, db.Pool, outbox.ListOptions{State: outbox.StatePending, Limit: n + 1})
	require.NoError(t, err)
	require.Len(t, entries, n, "every row still pending")
}

// The logical relay's table relay makes the same check: on a moved
// database LogicalRelay.Run returns ErrClusterMoved instead of streaming
// on while the outbox table's parked messages could never be published.
func TestLogicalRelayStopsOnAMovedDatabase(t *testing.T) {
	b := logicalSetup(t)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `UPDATE relay_partitions
		SET cursor_txid = (pg_snapshot_xmax(pg_current_snapshot())::text::numeric + 5 * 4294967296)::text::xid8`)
	require.NoError(t, err)
	pub, _ := publisher(t, b.nats.URL)
	r, err := outbox.NewLogicalRelay(b.db.Pool, b.ob, pub, &outbox.LogicalRelayConfig{Logger: testLogger(),
		Table: outbox.RelayConfig{Lease: 2 * time.Second, PollInterval: 100 * time.Millisecond}})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the logical relay did not stop")
	}
	require.ErrorIs(t, err, outbox.ErrClusterMoved)
	t.Logf("LogicalRelay.Run: %v", err)
}

// A database swapped under a running relay, its leases travelling with it:
// the relay's next lease renewal finds the cursors ahead of the server, and
// Run stops and returns ErrClusterMoved.
func TestRelayStopsWhenItsDatabaseIsSwappedUnderIt(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	pub, _ := publisher(t, b.nats.URL)
	reg := prometheus.NewRegistry()
	r, err := outbox.NewRelay(b.db.Pool, b.ob, pub, &outbox.RelayConfig{Lease: time.Second, PollInterval: 100 * time.Millisecond,
		Logger: testLogger(), Registerer: reg})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, func() bool { return metricValue(t, reg, "oncekit_outbox_partitions_owned") == 16 },
		20*time.Second, 20*time.Millisecond)

	_, err = b.db.Pool.Exec(ctx, `UPDATE relay_partitions
		SET cursor_txid = (pg_snapshot_xmax(pg_current_snapshot())::text::numeric + 5 * 4294967296)::text::xid8`)
	require.NoError(t, err)
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the relay did not stop")
	}
	var moved *outbox.ClusterMovedError
	require.ErrorAs(t, err, &moved)
	require.NotEmpty(t, moved.Cursor)
	var owned int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM relay_partitions WHERE owner IS NOT NULL`).Scan(&owned))
	require.Zero(t, owned, "the relay released its leases")
}
