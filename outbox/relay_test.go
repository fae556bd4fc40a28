package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

func TestRelayPublishesCommittedOnceAndNothingRolledBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var committed []broker.Message
	for i := range 50 {
		committed = append(committed, b.msg("k"+string(rune('a'+i%5)), i))
	}
	enqueue(t, b.db, b.ob, committed...)

	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = b.ob.Enqueue(ctx, tx, b.msg("ka", 100), b.msg("rolled-back", 0))
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))

	pub, _ := publisher(t, b.nats.URL)
	stop, reg := b.startRelay(t, pub, outbox.RelayConfig{})
	waitCount(t, b.stream, 50, 20*time.Second)
	require.Eventually(t, func() bool { return backlog(t, b) == 0 }, 10*time.Second, 20*time.Millisecond)
	stop()
	require.Equal(t, 50, publishedRows(t, b.db), "published rows stay until retention")
	require.EqualValues(t, 50, metricValue(t, reg, "oncekit_outbox_published_total"))

	// Replaying an operation after its events went out is still a no-op.
	res := enqueue(t, b.db, b.ob, committed[0])
	require.Equal(t, []uuid.UUID{committed[0].ID}, res.Duplicates)
	published, err := b.ob.List(ctx, b.db.Pool, outbox.ListOptions{State: outbox.StatePublished, Limit: 100})
	require.NoError(t, err)
	require.Len(t, published, 50)
	require.Equal(t, outbox.StatePublished, published[0].State())

	// A second relay finds nothing left to publish.
	b.startRelay(t, pub, outbox.RelayConfig{})
	more := b.msg("ka", 200)
	enqueue(t, b.db, b.ob, more)
	waitCount(t, b.stream, 51, 20*time.Second)
	requireExactlyOnceInOrder(t, readStream(t, b.stream), append(committed, more))
}

func TestRelayDoesNotSkipLateCommits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	pub, _ := publisher(t, b.nats.URL)
	b.startRelay(t, pub, outbox.RelayConfig{PollInterval: 20 * time.Millisecond})

	// Two concurrent writers: the first starts (and takes its txid and
	// sequence numbers) first but commits last.
	early, late := b.msg("k", 1), b.msg("k", 2)
	other := b.msg("other", 1)
	tx1, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx1.Rollback(ctx) }()
	_, err = b.ob.Enqueue(ctx, tx1, early)
	require.NoError(t, err)
	enqueue(t, b.db, b.ob, late, other) // commits while tx1 is open

	// While tx1 is open nothing of a later transaction may overtake it.
	require.Never(t, func() bool { return streamCount(t, b.stream) > 0 }, 500*time.Millisecond, 20*time.Millisecond)
	require.NoError(t, tx1.Commit(ctx))
	waitCount(t, b.stream, 3, 20*time.Second)
	got := readStream(t, b.stream)
	requireExactlyOnceInOrder(t, got, []broker.Message{early, late, other})
}

// plainPublisher hides natsjs.Publisher's PublishChain, so the relay uses
// its fallback of one round per message of a key.
type plainPublisher struct{ broker.Publisher }

func TestRelayFailingMessageBlocksOnlyItsKeyThenParks(t *testing.T) {
	t.Parallel()
	t.Run("chained", func(t *testing.T) {
		t.Parallel()
		testFailingMessage(t, func(p *natsjs.Publisher) broker.Publisher { return p })
	})
	t.Run("rounds", func(t *testing.T) {
		t.Parallel()
		testFailingMessage(t, func(p *natsjs.Publisher) broker.Publisher { return plainPublisher{p} })
	})
}

func testFailingMessage(t *testing.T, wrap func(*natsjs.Publisher) broker.Publisher) {
	b := setup(t)
	ctx := context.Background()
	// bad has a subject no stream captures: JetStream rejects it.
	bad := b.msg("k1", 1)
	bad.Subject = b.name + ".nostream"
	k1next := b.msg("k1", 2)
	others := []broker.Message{b.msg("k2", 1), b.msg("k2", 2), b.msg("", 0)}
	enqueue(t, b.db, b.ob, bad, k1next)
	enqueue(t, b.db, b.ob, others...)

	np, _ := publisher(t, b.nats.URL)
	_, reg := b.startRelay(t, wrap(np), outbox.RelayConfig{
		MaxAttempts: 3, MinBackoff: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		PublishTimeout: 2 * time.Second, PollInterval: 20 * time.Millisecond, StatsInterval: 20 * time.Millisecond,
	})
	waitCount(t, b.stream, 3, 20*time.Second)

	var attempts int
	var parked bool
	var lastErr string
	require.Eventually(t, func() bool {
		err := b.db.Pool.QueryRow(ctx, `SELECT attempts, parked_at IS NOT NULL, coalesce(last_error, '') FROM outbox WHERE id = $1`, bad.ID).
			Scan(&attempts, &parked, &lastErr)
		return assert.NoError(t, err) && parked
	}, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, 3, attempts)
	require.NotEmpty(t, lastErr)
	require.Eventually(t, func() bool { return metricValue(t, reg, "oncekit_outbox_parked") == 1 }, 10*time.Second, 20*time.Millisecond)
	// The counter moves just after the settle that parks the row commits.
	require.Eventually(t, func() bool {
		return metricValue(t, reg, "oncekit_outbox_publish_failures_total", "kind", "message") >= 3
	}, 10*time.Second, 20*time.Millisecond)

	// The rest of k1 waited; the other keys went through.
	got := readStream(t, b.stream)
	requireExactlyOnceInOrder(t, got, others)
	parkedRows, err := b.ob.List(ctx, b.db.Pool, outbox.ListOptions{State: outbox.StateParked})
	require.NoError(t, err)
	require.Len(t, parkedRows, 1)
	require.Equal(t, bad.ID, parkedRows[0].ID)

	// Fix the cause, unpark: k1's messages arrive, in order.
	_, err = natsjs.EnsureStream(ctx, b.nats.JS, natsjs.StreamConfig{Name: b.name, Subjects: []string{b.subject + ".>", bad.Subject}})
	require.NoError(t, err)
	n, err := b.ob.Unpark(ctx, b.db.Pool, bad.ID)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	waitCount(t, b.stream, 5, 20*time.Second)
	got = readStream(t, b.stream)
	requireExactlyOnceInOrder(t, got, append(others, bad, k1next))
}

func TestRelayBrokerOutageBacksOffAndLosesNothing(t *testing.T) {
	t.Parallel()
	b, srv := withRestartableBroker(t)

	pub, _ := publisher(t, srv.url)
	_, reg := b.startRelay(t, pub, outbox.RelayConfig{PublishTimeout: 500 * time.Millisecond, MaxBrokerBackoff: 300 * time.Millisecond, MaxAttempts: 2})
	var want []broker.Message
	for i := range 20 {
		want = append(want, b.msg("k", i))
	}
	enqueue(t, b.db, b.ob, want[:10]...)
	waitCount(t, b.stream, 10, 20*time.Second)

	srv.stop()
	enqueue(t, b.db, b.ob, want[10:]...)
	// The broker stays away for several seconds; the relay keeps backing off.
	down := time.Now()
	require.Eventually(t, func() bool {
		return time.Since(down) > 3*time.Second && metricValue(t, reg, "oncekit_outbox_publish_failures_total", "kind", "broker") >= 3
	}, 30*time.Second, 50*time.Millisecond)

	srv.start()
	waitCount(t, b.stream, 20, 30*time.Second)
	requireExactlyOnceInOrder(t, readStream(t, b.stream), want)
	var parked int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE parked_at IS NOT NULL`).Scan(&parked))
	require.Zero(t, parked, "an outage parks nothing")
}

func TestRetentionDeletesOnlyPublishedRowsInBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ins := func(sql string) {
		_, err := b.db.Pool.Exec(ctx, sql)
		require.NoError(t, err)
	}
	// Partition 0, all enqueued two hours ago unless said otherwise: a row
	// waiting for a retry, a parked one, then 30 published (the last 5
	// enqueued a minute ago), all behind the cursor; then a pending one.
	ins(`INSERT INTO outbox (id, partition, subject, payload, created_at, attempts, next_attempt_at)
		VALUES (gen_random_uuid(), 0, 's', '', now() - interval '2 hours', 1, now() + interval '1 hour')`)
	ins(`INSERT INTO outbox (id, partition, subject, payload, created_at, attempts, next_attempt_at, parked_at)
		VALUES (gen_random_uuid(), 0, 's', '', now() - interval '2 hours', 10, now(), now())`)
	ins(`INSERT INTO outbox (id, partition, subject, payload, created_at)
		SELECT gen_random_uuid(), 0, 's', '', now() - CASE WHEN g <= 25 THEN interval '2 hours' ELSE interval '1 minute' END
		FROM generate_series(1, 30) g ORDER BY g`)
	ins(`DELETE FROM relay_partitions; -- the test states the partitions
INSERT INTO relay_partitions (partition, cursor_txid, cursor_seq)
		SELECT 0, txid, seq FROM outbox ORDER BY txid DESC, seq DESC LIMIT 1`)
	ins(`INSERT INTO outbox (id, partition, subject, payload, created_at) VALUES (gen_random_uuid(), 0, 's', '', now() - interval '2 hours')`)
	require.Equal(t, 30, publishedRows(t, b.db))

	pub, _ := publisher(t, testenvNATSURL(b))
	log := &testenv.StatementLog{}
	r, err := outbox.NewRelay(b.db.TracedPool(t, log), b.ob, pub, &outbox.RelayConfig{Retention: time.Hour, RetentionBatch: 10})
	require.NoError(t, err)
	n, err := r.Prune(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 25, n)
	// Partition 0: 10 + 10 deleted, then 5 of the 10 looked at (the rest
	// is within retention); one statement for each other partition.
	var part0 int
	for _, st := range log.Matching("DELETE FROM") {
		if st.Args[0] == 0 {
			part0++
		}
	}
	require.Equal(t, 3, part0, "one bounded statement per RetentionBatch rows")
	require.Equal(t, 5, publishedRows(t, b.db), "published within retention: kept")
	require.Equal(t, 8, countRows(t, b.db), "held, parked and pending rows are never deleted")
	require.EqualValues(t, 2, backlog(t, b))
	n, err = r.Prune(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
}

func testenvNATSURL(b *bundle) string { return b.nats.URL }

// A retention pass deletes a batch of each partition in turn, so that the
// partitions' batches, whose rows share heap pages, follow one another
// through the history.
func TestRetentionTakesPartitionsInTurn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	// 25 published rows of partition 0, 5 of partition 1 and 15 of
	// partition 2, interleaved, all past retention.
	_, err := b.db.Pool.Exec(ctx, `INSERT INTO outbox (id, partition, subject, payload, created_at)
		SELECT gen_random_uuid(), CASE WHEN g % 9 < 5 THEN 0 WHEN g % 9 = 5 THEN 1 ELSE 2 END, 's', '', now() - interval '2 hours'
		FROM generate_series(0, 44) g ORDER BY g`)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `DELETE FROM relay_partitions; -- the test states the partitions
INSERT INTO relay_partitions (partition, cursor_txid, cursor_seq)
		SELECT p, l.txid, l.seq FROM generate_series(0, 2) p, (SELECT txid, seq FROM outbox ORDER BY txid DESC, seq DESC LIMIT 1) l`)
	require.NoError(t, err)
	pub, _ := publisher(t, testenvNATSURL(b))
	log := &testenv.StatementLog{}
	r, err := outbox.NewRelay(b.db.TracedPool(t, log), b.ob, pub, &outbox.RelayConfig{Retention: time.Hour,
		RetentionBatch: 10})
	require.NoError(t, err)
	n, err := r.Prune(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 45, n)
	var order []any
	for _, st := range log.Matching("DELETE FROM") {
		order = append(order, st.Args[0])
	}
	// Partition 1 is done after its first batch (5 rows), partition 2
	// after its second, partition 0 after its third.
	require.Equal(t, []any{0, 1, 2, 0, 2, 0}, order)
	require.Zero(t, countRows(t, b.db))
}

// A retention pass deletes at most RetentionRate rows per second: it spaces
// its statements RetentionBatch/RetentionRate apart.
func TestRetentionRateBoundsAPass(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `INSERT INTO outbox (id, partition, subject, payload, created_at)
		SELECT gen_random_uuid(), 0, 's', '', now() - interval '2 hours' FROM generate_series(1, 200)`)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `DELETE FROM relay_partitions; -- the test states the partitions
INSERT INTO relay_partitions (partition, cursor_txid, cursor_seq)
		SELECT 0, txid, seq FROM outbox ORDER BY txid DESC, seq DESC LIMIT 1`)
	require.NoError(t, err)
	pub, _ := publisher(t, testenvNATSURL(b))
	r, err := outbox.NewRelay(b.db.Pool, b.ob, pub, &outbox.RelayConfig{Retention: time.Hour,
		RetentionBatch: 20, RetentionRate: 400})
	require.NoError(t, err)
	start := time.Now()
	n, err := r.Prune(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 200, n)
	// 11 statements (10 full batches, then the one that finds none left), 50 ms apart.
	require.GreaterOrEqual(t, time.Since(start), 500*time.Millisecond)
	require.Less(t, float64(n)/time.Since(start).Seconds(), 400.0*1.1)
}

// Two relays' retention passes at once share the work: each partition is
// deleted by one pass at a time, each row once, and neither waits for the
// other. A partition whose pass is under way elsewhere (its advisory lock
// held) is left to that pass.
func TestConcurrentPrunesSharePartitions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `INSERT INTO outbox (id, partition, subject, payload, created_at)
		SELECT gen_random_uuid(), g % 16, 's', '', now() - interval '2 hours' FROM generate_series(1, 3200) g`)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `DELETE FROM relay_partitions; -- the test states the partitions
INSERT INTO relay_partitions (partition, cursor_txid, cursor_seq)
		SELECT p, l.txid, l.seq FROM generate_series(0, 15) p, (SELECT txid, seq FROM outbox ORDER BY txid DESC, seq DESC LIMIT 1) l`)
	require.NoError(t, err)
	pub, _ := publisher(t, testenvNATSURL(b))
	relay := func() *outbox.Relay {
		r, err := outbox.NewRelay(b.db.Pool, b.ob, pub, &outbox.RelayConfig{Retention: time.Hour, RetentionBatch: 10})
		require.NoError(t, err)
		return r
	}

	// Partition 3's pass is under way elsewhere.
	holder, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx) //nolint:errcheck
	_, err = holder.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('oncekit.outbox.prune:"' || $1 || '"'), 3)`, b.db.Schema)
	require.NoError(t, err)

	var deleted [2]int64
	var wg sync.WaitGroup
	for i := range deleted {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := relay().Prune(ctx)
			assert.NoError(t, err)
			deleted[i] = n
		}()
	}
	wg.Wait()
	require.EqualValues(t, 3000, deleted[0]+deleted[1], "every row once, partition 3's left to its pass")
	require.Equal(t, 200, countRows(t, b.db))

	require.NoError(t, holder.Rollback(ctx))
	n, err := relay().Prune(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 200, n)
	require.Zero(t, countRows(t, b.db))
}

func TestRelaySurvivesLostDatabaseConnections(t *testing.T) {
	t.Parallel()
	testenv.RequireDirect(t, "it ends the relay's server connections by their application_name, which a pooler's do not carry")
	b := setup(t)
	ctx := context.Background()
	b.ob = newOutbox(t, b.db, outbox.Config{Notify: true})
	// The relay gets a pool of its own, named so that its sessions can be
	// found and killed.
	app := testenv.Name(t)
	pcfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	pcfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	pub, _ := publisher(t, b.nats.URL)
	r, err := outbox.NewRelay(pool, b.ob, pub, &outbox.RelayConfig{Logger: testLogger(), Lease: 2 * time.Second, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })

	enqueue(t, b.db, b.ob, b.msg("k", 0))
	waitCount(t, b.stream, 1, 20*time.Second)
	require.Eventually(t, func() bool { return listeners(t, b) == 1 }, 10*time.Second, 10*time.Millisecond)

	// Every session of the relay is killed, the LISTEN connection included;
	// the relay reconnects and carries on.
	var killed int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = $1`, app).Scan(&killed))
	require.NotZero(t, killed)
	for i := 1; i <= 3; i++ {
		enqueue(t, b.db, b.ob, b.msg("k", i))
	}
	waitCount(t, b.stream, 4, 30*time.Second)
	require.Eventually(t, func() bool { return listeners(t, b) == 1 }, 30*time.Second, 20*time.Millisecond, "LISTEN is re-established")
}

// Run refuses a second call while the first runs, and a relay whose Run
// returned runs again, taking its partitions anew.
func TestRelayRunsAgainAfterRunReturned(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pub, _ := publisher(t, b.nats.URL)
	r, err := outbox.NewRelay(b.db.Pool, b.ob, pub, &outbox.RelayConfig{Lease: 2 * time.Second,
		PollInterval: 50 * time.Millisecond, Logger: testLogger()})
	require.NoError(t, err)
	for round := range 2 {
		enqueue(t, b.db, b.ob, b.msg("k", round))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		waitCount(t, b.stream, uint64(round+1), 20*time.Second)
		require.ErrorIs(t, r.Run(ctx), oncekit.ErrAlreadyRunning)
		cancel()
		require.NoError(t, <-done)
	}
}

// Writers and relays read the partition count from the database, where the
// migrations stated it once: with 3 partitions, every row lands in one of
// them and a relay configured with nothing about partitions publishes all.
func TestWritersAndRelaysShareTheDatabasesPartitionCount(t *testing.T) {
	t.Parallel()
	b := setup(t)
	setPartitions(t, b.db, 3)
	var msgs []broker.Message
	for i := range 60 {
		msgs = append(msgs, b.msg(fmt.Sprintf("key-%d", i%20), i))
	}
	enqueue(t, b.db, b.ob, msgs...)
	var beyond int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE partition >= 3`).Scan(&beyond))
	require.Zero(t, beyond)
	pub, _ := publisher(t, b.nats.URL)
	b.startRelay(t, pub, outbox.RelayConfig{})
	waitCount(t, b.stream, 60, 20*time.Second)
}
