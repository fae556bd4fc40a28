package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// TestPartitionExprMatchesGo checks that the INSERT's partition (computed
// in SQL from the hash) is partitionOf's, for counts up to MaxPartitions.
func TestPartitionExprMatchesGo(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		m := broker.Message{Key: fmt.Sprintf("key-%d", r.Int64())}
		n := 1 + r.IntN(outbox.MaxPartitions)
		if r.IntN(4) == 0 {
			n = []int{1, 2, 16, 64, outbox.MaxPartitions}[r.IntN(5)]
		}
		var got int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT `+outbox.PartitionExpr("$1::int8", "$2::int"),
			int64(outbox.PartitionHash(m)), n).Scan(&got))
		require.Equal(t, outbox.PartitionOf(m, n), got, "key %q, %d partitions", m.Key, n)
	}
}

func TestRepartitionRefusesBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for _, n := range []int{0, -1, outbox.MaxPartitions + 1, 1 << 40} {
		require.ErrorIs(t, b.ob.Repartition(ctx, b.db.Pool, n), outbox.ErrInvalidPartitions, "n=%d", n)
	}
	require.ErrorIs(t, b.ob.Repartition(ctx, b.db.Pool, outbox.DefaultPartitions), outbox.ErrSamePartitions)
	st, err := b.ob.RepartitionState(ctx, b.db.Pool)
	require.NoError(t, err)
	require.Equal(t, outbox.RepartitionState{Epoch: 0, Partitions: 16, ChangedAt: st.ChangedAt}, st)

	// No relay runs: the change stays in its drain, and a second one is
	// refused until the relays have finished it.
	require.NoError(t, b.ob.Repartition(ctx, b.db.Pool, 64))
	err = b.ob.Repartition(ctx, b.db.Pool, 16)
	require.ErrorIs(t, err, outbox.ErrRepartitionInProgress)
	require.ErrorContains(t, err, "phase drain (from 16 to 64 partitions)")
	st, err = b.ob.RepartitionState(ctx, b.db.Pool)
	require.NoError(t, err)
	require.Equal(t, 1, st.Epoch)
	require.Equal(t, 64, st.Partitions)
	require.Equal(t, 16, st.Previous)
	require.Equal(t, outbox.PhaseDrain, st.Phase)
	n, err := b.ob.PartitionCount(ctx, b.db.Pool)
	require.NoError(t, err)
	require.Equal(t, 64, n)
	var rows int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM relay_partitions`).Scan(&rows))
	require.Equal(t, 64, rows)

	// A cancelled context gives up the wait for a writer in flight.
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = b.ob.Enqueue(ctx, tx, b.msg("k", 0))
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	err = b.ob.Repartition(short, b.db.Pool, 32)
	require.Error(t, err)
	require.False(t, errors.Is(err, outbox.ErrRepartitionInProgress), "the lock is taken before the state is read: %v", err)
}

// writers enqueue continuously, each its own keys, in transactions of one to
// three messages, some of which stay open a moment after their INSERT (a
// writer in flight when a repartition comes). wrote returns what each
// committed, in commit order per key.
type writers struct {
	stop  atomic.Bool
	wg    sync.WaitGroup
	mu    sync.Mutex
	sent  []broker.Message
	count atomic.Int64
	err   atomic.Pointer[error]
}

func startWriters(t *testing.T, b *bundle, n, keysEach int) *writers {
	t.Helper()
	w := &writers{}
	for i := range n {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 7))
			seq := 0
			for !w.stop.Load() {
				msgs := make([]broker.Message, 1+r.IntN(3))
				for j := range msgs {
					msgs[j] = b.msg(fmt.Sprintf("w%d-k%d", i, r.IntN(keysEach)), seq)
					seq++
				}
				err := pgx.BeginFunc(context.Background(), b.db.Pool, func(tx pgx.Tx) error {
					if _, err := b.ob.Enqueue(context.Background(), tx, msgs...); err != nil {
						return err
					}
					if r.IntN(10) == 0 {
						time.Sleep(time.Duration(r.IntN(20)) * time.Millisecond) // work in the transaction
					}
					return nil
				})
				if err != nil {
					w.err.Store(&err)
					return
				}
				w.mu.Lock()
				w.sent = append(w.sent, msgs...)
				w.mu.Unlock()
				w.count.Add(int64(len(msgs)))
			}
		}()
	}
	return w
}

// grow waits until the writers wrote n more messages.
func (w *writers) grow(t *testing.T, n int64) {
	t.Helper()
	target := w.count.Load() + n
	require.Eventually(t, func() bool { return w.count.Load() >= target || w.err.Load() != nil }, 60*time.Second, 5*time.Millisecond)
	require.Nil(t, w.err.Load())
}

func (w *writers) finish(t *testing.T) []broker.Message {
	t.Helper()
	w.stop.Store(true)
	w.wg.Wait()
	if e := w.err.Load(); e != nil {
		require.NoError(t, *e)
	}
	return w.sent
}

// waitDone waits until the relays have finished the repartition.
func waitDone(t *testing.T, b *bundle) {
	t.Helper()
	require.Eventually(t, func() bool {
		st, err := b.ob.RepartitionState(context.Background(), b.db.Pool)
		require.NoError(t, err)
		return st.Phase == ""
	}, 90*time.Second, 20*time.Millisecond, "the repartition should finish")
}

func TestRepartitionOnlineKeepsPerKeyOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	pub, _ := publisher(t, b.nats.URL)
	cfg := outbox.RelayConfig{BatchSize: 20, Retention: time.Millisecond, RetentionInterval: 200 * time.Millisecond}
	cfg.ID = "r1"
	b.startRelay(t, pub, cfg)
	cfg.ID = "r2"
	b.startRelay(t, pub, cfg)

	w := startWriters(t, b, 4, 8)
	w.grow(t, 300)
	t0 := time.Now()
	require.NoError(t, b.ob.Repartition(ctx, b.db.Pool, 64))
	t1 := time.Now()
	waitDone(t, b)
	t.Logf("16 → 64: the change took %v, the drain %v", t1.Sub(t0), time.Since(t1))
	w.grow(t, 300)
	// Both relays serve the 64 partitions.
	require.Eventually(t, func() bool {
		leases, err := b.ob.PartitionLeases(ctx, b.db.Pool)
		require.NoError(t, err)
		owned := 0
		for _, l := range leases {
			if l.Owner != "" {
				owned++
			}
		}
		return len(leases) == 64 && owned == 64
	}, 30*time.Second, 20*time.Millisecond)
	t0 = time.Now()
	require.NoError(t, b.ob.Repartition(ctx, b.db.Pool, 16))
	t1 = time.Now()
	w.grow(t, 100)
	waitDone(t, b)
	t.Logf("64 → 16: the change took %v, the drain %v", t1.Sub(t0), time.Since(t1))
	w.grow(t, 300)
	sent := w.finish(t)

	waitCount(t, b.stream, uint64(len(sent)), 90*time.Second)
	require.Eventually(t, func() bool { return backlog(t, b) == 0 }, 30*time.Second, 20*time.Millisecond)
	requireExactlyOnceInOrder(t, readStream(t, b.stream), sent)
	// The partitions beyond 16 are retired once retention has emptied
	// them.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM relay_partitions`).Scan(&n))
		return n == 16
	}, 60*time.Second, 50*time.Millisecond, "partitions 16 to 63 should be retired")
	t.Logf("%d messages, %d keys", len(sent), 32)
}

// backlogAcross enqueues rounds of messages over keys with no relay
// running, repartitions to n, and enqueues more of the same keys.
func backlogAcross(t *testing.T, b *bundle, keys, before, after, n int) []broker.Message {
	t.Helper()
	var sent []broker.Message
	round := func(i int) {
		msgs := make([]broker.Message, keys)
		for k := range msgs {
			msgs[k] = b.msg(fmt.Sprintf("k%d", k), i)
		}
		enqueue(t, b.db, b.ob, msgs...)
		sent = append(sent, msgs...)
	}
	for i := range before {
		round(i)
	}
	require.NoError(t, b.ob.Repartition(context.Background(), b.db.Pool, n))
	for i := range after {
		round(before + i)
	}
	return sent
}

// outOfOrder counts the keys whose messages the stream holds in another
// order than sent.
func outOfOrder(got []streamMsg, sent []broker.Message) int {
	want, have := map[string][]string{}, map[string][]string{}
	for _, m := range sent {
		want[m.Key] = append(want[m.Key], m.ID.String())
	}
	for _, m := range got {
		have[m.key] = append(have[m.key], m.id)
	}
	bad := 0
	for k, ids := range want {
		if fmt.Sprint(ids) != fmt.Sprint(have[k]) {
			bad++
		}
	}
	return bad
}

// TestRepartitionBarrierKeepsOrder runs the same backlog across a
// repartition with and without the barrier: without it, the rows written
// after the change (in other partitions) overtake their keys' rows written
// before it.
func TestRepartitionBarrierKeepsOrder(t *testing.T) { // not parallel: NoBarrier is global
	for _, barrier := range []bool{false, true} {
		t.Run(fmt.Sprintf("barrier=%v", barrier), func(t *testing.T) {
			outbox.NoBarrier(!barrier)
			t.Cleanup(func() { outbox.NoBarrier(false) })
			b := setup(t)
			sent := backlogAcross(t, b, 40, 30, 5, 64)
			// The status reads count the rows of both epochs, in the
			// partitions of both counts.
			require.EqualValues(t, len(sent), backlog(t, b))
			un, err := b.ob.UnpublishedByPartition(context.Background(), b.db.Pool)
			require.NoError(t, err)
			require.EqualValues(t, len(sent), un.Rows.Pending)
			var parts int
			require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(DISTINCT partition) FROM outbox`).Scan(&parts))
			require.Len(t, un.Partitions, parts)
			pub, _ := publisher(t, b.nats.URL)
			cfg := outbox.RelayConfig{BatchSize: 5}
			cfg.ID = "r1"
			b.startRelay(t, pub, cfg)
			cfg.ID = "r2"
			b.startRelay(t, pub, cfg)
			waitCount(t, b.stream, uint64(len(sent)), 90*time.Second)
			got := readStream(t, b.stream)
			bad := outOfOrder(got, sent)
			t.Logf("barrier %v: %d of 40 keys out of order", barrier, bad)
			if barrier {
				requireExactlyOnceInOrder(t, got, sent)
				waitDone(t, b)
			} else {
				require.Positive(t, bad, "without the barrier, keys should lose their order")
			}
		})
	}
}

// TestRepartitionWaitsForWritersInFlight shows the switch between a writer
// in flight, whose row keeps the old count, and the writers after it, whose
// rows take the new one: Repartition waits for the first to commit, and the
// second waits for Repartition.
func TestRepartitionWaitsForWritersInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	key := "in-flight"
	n := 64
	for outbox.PartitionOf(broker.Message{Key: key}, n) == outbox.PartitionOf(broker.Message{Key: key}, 16) {
		key += "+"
	}
	early, late := b.msg(key, 0), b.msg(key, 1)
	tx1, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx1.Rollback(ctx) }()
	_, err = b.ob.Enqueue(ctx, tx1, early)
	require.NoError(t, err)

	switched := make(chan error, 1)
	go func() { switched <- b.ob.Repartition(ctx, b.db.Pool, n) }()
	require.Eventually(t, func() bool { return waitingOn(t, b, "outbox_epoch") >= 1 }, 10*time.Second, 10*time.Millisecond)
	wrote := make(chan error, 1)
	go func() {
		wrote <- pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			_, err := b.ob.Enqueue(ctx, tx, late)
			return err
		})
	}()
	require.Eventually(t, func() bool { return waitingOn(t, b, "outbox_epoch") >= 2 }, 10*time.Second, 10*time.Millisecond)
	require.Empty(t, switched)
	require.Empty(t, wrote)

	require.NoError(t, tx1.Commit(ctx))
	require.NoError(t, <-switched)
	require.NoError(t, <-wrote)
	type row struct{ partition, epoch int }
	read := func(id any) (r row) {
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT partition, epoch FROM outbox WHERE id = $1`, id).Scan(&r.partition, &r.epoch))
		return r
	}
	require.Equal(t, row{outbox.PartitionOf(early, 16), 0}, read(early.ID))
	require.Equal(t, row{outbox.PartitionOf(late, n), 1}, read(late.ID))
}

// waitingOn counts the sessions waiting for a lock on the schema's table.
func waitingOn(t *testing.T, b *bundle, table string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks l
		JOIN pg_class c ON c.oid = l.relation JOIN pg_namespace s ON s.oid = c.relnamespace
		WHERE NOT l.granted AND c.relname = $1 AND s.nspname = $2`, table, b.db.Schema).Scan(&n))
	return n
}

// TestRepartitionParkedRowHoldsOnlyItsKey parks a row of the epoch before a
// repartition: the drain ends without it (every other key flows), the rows
// of its key written after the change wait behind it in their new
// partition, and follow it in order once it is unparked and published.
func TestRepartitionParkedRowHoldsOnlyItsKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	n := 64
	key := "stuck"
	for outbox.PartitionOf(broker.Message{Key: key}, n) == outbox.PartitionOf(broker.Message{Key: key}, 16) {
		key += "+"
	}
	pub, _ := publisher(t, b.nats.URL)
	b.startRelay(t, pub, outbox.RelayConfig{MaxAttempts: 2, MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		PublishTimeout: time.Second, PollInterval: 20 * time.Millisecond})

	bad := b.msg(key, 0)
	bad.Subject = b.name + ".later" // no stream captures it yet
	stuck := []broker.Message{bad, b.msg(key, 1)}
	flowing := []broker.Message{b.msg("other", 0)}
	enqueue(t, b.db, b.ob, stuck...)
	enqueue(t, b.db, b.ob, flowing...)
	require.Eventually(t, func() bool {
		var parked bool
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT parked_at IS NOT NULL FROM outbox WHERE id = $1`, bad.ID).Scan(&parked))
		return parked
	}, 30*time.Second, 20*time.Millisecond)
	waitCount(t, b.stream, 1, 20*time.Second)

	require.NoError(t, b.ob.Repartition(ctx, b.db.Pool, n))
	after := []broker.Message{b.msg(key, 2), b.msg("other", 1), b.msg(key, 3), b.msg("other", 2)}
	enqueue(t, b.db, b.ob, after...)
	stuck = append(stuck, after[0], after[2])
	flowing = append(flowing, after[1], after[3])

	// The drain does not wait for the parked row: it ends in PhaseHeld,
	// "other" flows, and the parked row's key waits in its new partition.
	require.Eventually(t, func() bool {
		st, err := b.ob.RepartitionState(ctx, b.db.Pool)
		require.NoError(t, err)
		return st.Phase == outbox.PhaseHeld
	}, 30*time.Second, 20*time.Millisecond)
	waitCount(t, b.stream, uint64(len(flowing)), 20*time.Second)
	require.Never(t, func() bool { return streamCount(t, b.stream) > uint64(len(flowing)) }, time.Second, 20*time.Millisecond)
	requireExactlyOnceInOrder(t, readStream(t, b.stream), flowing)
	require.ErrorIs(t, b.ob.Repartition(ctx, b.db.Pool, 16), outbox.ErrRepartitionInProgress)

	// Fixed and unparked, the parked row goes out and its key follows in
	// order; the repartition is done.
	_, err := natsjs.EnsureStream(ctx, b.nats.JS, natsjs.StreamConfig{Name: b.name, Subjects: []string{b.subject + ".>", bad.Subject}})
	require.NoError(t, err)
	_, err = b.ob.UnparkAll(ctx, b.db.Pool)
	require.NoError(t, err)
	all := append(append([]broker.Message{}, flowing...), stuck...)
	waitCount(t, b.stream, uint64(len(all)), 30*time.Second)
	requireExactlyOnceInOrder(t, readStream(t, b.stream), all)
	waitDone(t, b)
}

// TestRepartitionHostileEpochRow: counts out of range are refused by the
// table itself; without its row, Enqueue fails with ErrNoEpoch and writes
// nothing, and Repartition and PartitionCount fail; two changes at once
// make one, and the other is refused as in progress.
func TestRepartitionHostileEpochRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for _, n := range []int{0, -3, outbox.MaxPartitions + 1} {
		_, err := b.db.Pool.Exec(ctx, `UPDATE outbox_epoch SET partitions = $1`, n)
		require.ErrorContains(t, err, "violates check constraint", "partitions = %d", n)
	}
	_, err := b.db.Pool.Exec(ctx, `INSERT INTO outbox_epoch (one, partitions) VALUES (false, 8)`)
	require.ErrorContains(t, err, "violates check constraint")

	_, err = b.db.Pool.Exec(ctx, `DELETE FROM outbox_epoch`)
	require.NoError(t, err)
	err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		_, err := b.ob.Enqueue(ctx, tx, b.msg("k", 0), b.msg("", 1))
		return err
	})
	require.ErrorIs(t, err, outbox.ErrNoEpoch)
	require.Zero(t, countRows(t, b.db))
	require.Error(t, b.ob.Repartition(ctx, b.db.Pool, 32))
	_, err = b.ob.PartitionCount(ctx, b.db.Pool)
	require.Error(t, err)

	_, err = b.db.Pool.Exec(ctx, `INSERT INTO outbox_epoch (partitions) VALUES (16)`)
	require.NoError(t, err)
	enqueue(t, b.db, b.ob, b.msg("k", 0))
	errs := make(chan error, 2)
	for _, n := range []int{32, 48} {
		go func() { errs <- b.ob.Repartition(ctx, b.db.Pool, n) }()
	}
	first, second := <-errs, <-errs
	if first != nil {
		first, second = second, first
	}
	require.NoError(t, first)
	require.ErrorIs(t, second, outbox.ErrRepartitionInProgress)
}

// TestRepartitionRepeatableReadWriterWithAnOlderSnapshot: a REPEATABLE READ
// writer whose snapshot predates a repartition would read the old count;
// its Enqueue fails with a serialization error instead (to be retried),
// and one whose snapshot follows the change writes with the new count.
func TestRepartitionRepeatableReadWriterWithAnOlderSnapshot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		st, err := b.ob.RepartitionState(ctx, b.db.Pool)
		require.NoError(t, err)
		if st.Phase != "" {
			_, err = b.db.Pool.Exec(ctx, `UPDATE outbox_epoch SET phase = NULL`) // no relay runs here
			require.NoError(t, err)
		}
		n := 64
		if st.Partitions == 64 {
			n = 16
		}
		tx, err := b.db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		var one int
		require.NoError(t, tx.QueryRow(ctx, `SELECT 1`).Scan(&one)) // the snapshot
		require.NoError(t, b.ob.Repartition(ctx, b.db.Pool, n))
		_, err = b.ob.Enqueue(ctx, tx, b.msg("k", 0))
		var pg *pgconn.PgError
		require.ErrorAs(t, err, &pg, "%s", iso)
		require.Equal(t, "40001", pg.Code, "%s: %v", iso, err)
		require.NoError(t, tx.Rollback(ctx))

		m := b.msg("k", 1)
		require.NoError(t, pgx.BeginTxFunc(ctx, b.db.Pool, pgx.TxOptions{IsoLevel: iso}, func(tx pgx.Tx) error {
			_, err := b.ob.Enqueue(ctx, tx, m)
			return err
		}))
		var part int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT partition FROM outbox WHERE id = $1`, m.ID).Scan(&part))
		require.Equal(t, outbox.PartitionOf(m, n), part, "%s", iso)
	}
}
