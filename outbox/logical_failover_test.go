package outbox_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// failoverRig is a primary with a streaming standby made to keep its
// logical slots (a physical slot, hot_standby_feedback; on PostgreSQL 17
// slot sync and synchronized_standby_slots), and a bundle whose database
// is reached through an address that follows the primary.
type failoverRig struct {
	primary, standby *pgcluster.Cluster
	addr             *failoverAddr
	b                *bundle
}

func newFailoverRig(t *testing.T, pg17 bool) *failoverRig {
	t.Helper()
	ctx := context.Background()
	opt := pgcluster.Options{LogDir: t.TempDir(),
		Settings: "wal_level = logical\nmax_replication_slots = 10\nmax_wal_senders = 10\nfsync = off\n"}
	var primary *pgcluster.Cluster
	if pg17 {
		primary = pgcluster.StartPG17ForTest(ctx, t, opt)
	} else {
		primary = pgcluster.StartForTest(ctx, t, opt)
	}
	addr := newFailoverAddr(t, primary.Addr())
	b := setupDB(t, testenv.NewDBOn(t, "postgres://postgres@"+addr.Addr()+"/postgres?sslmode=disable"))
	b.ob = newOutbox(t, b.db, outbox.Config{Logical: true})
	require.NoError(t, b.ob.SetUpLogical(ctx, b.db.Pool))
	standby, err := primary.FailoverStandby(ctx, "failover_standby")
	require.NoError(t, err)
	t.Cleanup(standby.Close)
	return &failoverRig{primary: primary, standby: standby, addr: addr, b: b}
}

// query runs sql on c's postgres database (the test's schema is in it).
func query(t *testing.T, c *pgcluster.Cluster, sql string, args []any, dest ...any) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	if len(dest) == 0 {
		_, err = conn.Exec(ctx, sql, args...)
	} else {
		err = conn.QueryRow(ctx, sql, args...).Scan(dest...)
	}
	require.NoError(t, err, sql)
}

// waitReplayed waits until the standby replayed everything the primary
// wrote so far.
func (rig *failoverRig) waitReplayed(t *testing.T) {
	t.Helper()
	var at string
	query(t, rig.primary, `SELECT pg_current_wal_lsn()::text`, nil, &at)
	require.Eventually(t, func() bool {
		var done bool
		query(t, rig.standby, `SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn`, []any{at}, &done)
		return done
	}, 30*time.Second, 20*time.Millisecond, "the standby replays the primary's WAL")
}

// failover stops the primary at once (a crash), promotes the standby and
// moves the address to it.
func (rig *failoverRig) failover(t *testing.T) {
	t.Helper()
	require.NoError(t, rig.primary.StopImmediate())
	start := time.Now()
	require.NoError(t, rig.standby.Promote(context.Background()))
	t.Logf("standby promoted in %v", time.Since(start).Round(time.Millisecond))
	rig.addr.moveTo(rig.standby.Addr())
	rig.b.db.Pool.Reset() // its connections went with the old primary
}

// recordedLSN is where logical_slots records the slot standing.
func (rig *failoverRig) recordedLSN(t *testing.T) pglogrepl.LSN {
	t.Helper()
	var s *string
	require.NoError(t, rig.b.db.Pool.QueryRow(context.Background(),
		`SELECT confirmed_lsn::text FROM logical_slots WHERE slot = $1`, "oncekit_"+rig.b.db.Schema).Scan(&s))
	if s == nil {
		return 0
	}
	lsn, err := pglogrepl.ParseLSN(*s)
	require.NoError(t, err)
	return lsn
}

// enqueueRetrying enqueues msgs in one transaction, again while the
// pool's connections to a server that went away fail.
func enqueueRetrying(t *testing.T, b *bundle, msgs ...broker.Message) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		err = pgx.BeginFunc(context.Background(), b.db.Pool, func(tx pgx.Tx) error {
			_, err := b.ob.Enqueue(context.Background(), tx, msgs...)
			return err
		})
		if err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond) // a new connection, not a state to wait for
	}
	require.NoError(t, err)
}

// uniqueIDs is the set of event IDs in the stream.
func uniqueIDs(t *testing.T, b *bundle) map[string]bool {
	t.Helper()
	ids := map[string]bool{}
	for _, m := range readStream(t, b.stream) {
		ids[m.id] = true
	}
	return ids
}

// Before PostgreSQL 17 no logical slot survives a failover. After the
// primary crashes and its standby is promoted, the relay finds its slot
// missing on a server of the same system on a later timeline, and stops
// with a SlotLostError naming the window of events that may be missing:
// from the position it last recorded (logical_slots, replicated) to the
// timeline's switch point. It makes no new slot, and streams from none
// made there after the switch.
func TestLogicalRelayStopsWhenAFailoverLostItsSlot(t *testing.T) {
	t.Parallel()
	rig := newFailoverRig(t, false)
	b := rig.b
	pub, _ := publisher(t, b.nats.URL)
	stop, _ := b.startLogicalRelay(t, pub, outbox.LogicalRelayConfig{})
	for i := range 20 {
		enqueue(t, b.db, b.ob, b.msg("k", i))
	}
	waitCount(t, b.stream, 20, 30*time.Second)
	published := currentLSN(t, b)
	require.Eventually(t, func() bool { return rig.recordedLSN(t) >= published }, 30*time.Second, 20*time.Millisecond,
		"the relay records where its slot stands")
	stop()
	recorded := rig.recordedLSN(t)

	// Events committed while no relay streams: replicated, never decoded.
	from := currentLSN(t, b)
	for i := 20; i < 30; i++ {
		enqueue(t, b.db, b.ob, b.msg("k", i))
	}
	to := currentLSN(t, b)
	rig.waitReplayed(t)
	rig.failover(t)

	reg := prometheus.NewRegistry()
	r, err := outbox.NewLogicalRelay(b.db.Pool, b.ob, pub, &outbox.LogicalRelayConfig{Logger: testLogger(), Registerer: reg,
		StatusInterval: 200 * time.Millisecond, Table: outbox.RelayConfig{Lease: 2 * time.Second, PollInterval: 100 * time.Millisecond}})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	err = r.Run(ctx)
	took := time.Since(start)
	runErr := err
	var lost *outbox.SlotLostError
	require.ErrorAs(t, err, &lost, "the relay stops with a SlotLostError")
	require.ErrorIs(t, err, outbox.ErrSlotLost)
	require.Equal(t, "failover", lost.Reason, "%v", err)
	require.Equal(t, recorded.String(), lost.Confirmed, "the window starts at the recorded position")
	require.LessOrEqual(t, recorded, from)
	switched, perr := pglogrepl.ParseLSN(lost.SwitchLSN)
	require.NoError(t, perr, "the switch point is named: %v", err)
	require.GreaterOrEqual(t, switched, to, "the window ends after the events committed while no relay streamed")
	require.Equal(t, int64(1), lost.FromTimeline)
	require.Equal(t, int64(2), lost.ToTimeline)
	require.False(t, lost.ConfirmedAt.IsZero())
	require.Contains(t, err.Error(), "after "+recorded.String())
	require.Contains(t, err.Error(), "up to the failover at "+lost.SwitchLSN)
	require.Equal(t, 1.0, metricValue(t, reg, "oncekit_outbox_logical_slot_lost"))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		require.NotContains(t, mf.GetName(), "standby_slot", "a relay without a Standby has no standby gauge")
	}

	var slots int
	query(t, rig.standby, `SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'`, nil, &slots)
	require.Zero(t, slots, "the relay made a new slot")
	require.EqualValues(t, 20, streamCount(t, b.stream), "events published from a new slot")
	t.Logf("stopped %v after the failover: %v", took.Round(time.Millisecond), runErr)

	// A slot made on the promoted server under the name (by hand, by a
	// tool) starts after the switch: it is not the one the relay
	// confirmed into.
	query(t, rig.standby, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, []any{"oncekit_" + b.db.Schema})
	r, err = outbox.NewLogicalRelay(b.db.Pool, b.ob, pub, &outbox.LogicalRelayConfig{Logger: testLogger(),
		StatusInterval: 200 * time.Millisecond, Table: outbox.RelayConfig{Lease: 2 * time.Second, PollInterval: 100 * time.Millisecond}})
	require.NoError(t, err)
	err = r.Run(ctx)
	require.ErrorAs(t, err, &lost)
	require.Equal(t, "replaced", lost.Reason, "%v", err)
	require.Equal(t, recorded.String(), lost.Confirmed)
	require.Contains(t, err.Error(), "made anew on this server after a failover")
	require.EqualValues(t, 20, streamCount(t, b.stream), "events published from the new slot")
}

// On PostgreSQL 17 with a failover slot, a standby that syncs it, and
// synchronized_standby_slots on the primary, the relay goes on streaming on
// the promoted standby from its copy of the slot: every event enqueued
// before the failover (some published, some committed while the broker was
// down) and after it reaches the stream. The standby gauge reads 1 while
// the copy is synced and within StandbyMaxLag, 0 while the standby is down.
func TestLogicalRelayKeepsItsSlotAcrossAFailoverOn17(t *testing.T) {
	t.Parallel()
	rig := newFailoverRig(t, true)
	b := rig.b
	br := restartableBroker(t, b)
	pub, _ := publisher(t, br.url)
	standby, err := pgxpool.New(context.Background(), rig.standby.URL("postgres"))
	require.NoError(t, err)
	t.Cleanup(standby.Close)
	start := time.Now()
	stop, reg := b.startLogicalRelay(t, pub, outbox.LogicalRelayConfig{Standby: standby, StandbyMaxLag: 64 << 10,
		PublishTimeout: 500 * time.Millisecond})
	ready := func() float64 { return metricValue(t, reg, "oncekit_outbox_logical_standby_slot_ready") }
	require.Eventually(t, func() bool { return ready() == 1 }, 60*time.Second, 20*time.Millisecond, "the standby's copy gets ready")
	t.Logf("standby's copy ready %v after the relay started", time.Since(start).Round(time.Millisecond))

	var want []broker.Message
	add := func(n int, size int, enq func(...broker.Message)) {
		for range n {
			m := b.msg(fmt.Sprintf("k%d", len(want)%5), len(want))
			if size > 0 {
				m.Payload = bytes.Repeat([]byte("x"), size)
			}
			enq(m)
			want = append(want, m)
		}
	}
	onPrimary := func(m ...broker.Message) { enqueueRetrying(t, b, m...) }
	add(30, 0, onPrimary)
	waitCount(t, b.stream, 30, 30*time.Second)

	// The standby goes down: no copy can be read, none is ready. The
	// primary holds the logical stream back meanwhile
	// (synchronized_standby_slots): events committed now wait.
	require.NoError(t, rig.standby.StopImmediate())
	require.Eventually(t, func() bool { return ready() == 0 }, 30*time.Second, 20*time.Millisecond,
		"the gauge reads 0 while the standby is down")
	add(20, 0, onPrimary)
	resumed := time.Now()
	require.NoError(t, rig.standby.Start(context.Background()))
	if !assert.Eventually(t, func() bool { return ready() == 1 }, 90*time.Second, 20*time.Millisecond, "the copy gets ready again") {
		logText, _ := os.ReadFile(rig.primary.LogPath())
		t.Fatalf("lag gauge %v; log:\n%s", metricValue(t, reg, "oncekit_outbox_logical_standby_slot_lag_bytes"), logText)
	}
	t.Logf("ready again %v after the standby started again", time.Since(resumed).Round(time.Millisecond))
	waitCount(t, b.stream, uint64(len(want)), 30*time.Second)

	// A copy further behind the primary's position than StandbyMaxLag is
	// not ready, though synced.
	far, err := b.ob.StandbySlotStatus(context.Background(), standby, outbox.SlotStatus{ConfirmedLSN: "1/0"}, 64<<10)
	require.NoError(t, err)
	require.True(t, far.Synced && !far.Temporary && far.Invalidation == "")
	require.False(t, far.Ready, "a copy %d bytes behind is ready", far.LagBytes)

	// Committed while the broker is down: neither published nor confirmed
	// when the primary goes.
	br.stop()
	add(30, 0, onPrimary)
	rig.waitReplayed(t)
	rig.failover(t)
	failedOver := time.Now()
	br.start()
	add(30, 0, func(m ...broker.Message) { enqueueRetrying(t, b, m...) })
	require.Eventually(t, func() bool { return len(uniqueIDs(t, b)) >= len(want) }, 60*time.Second, 50*time.Millisecond,
		"every event reaches the stream")
	took := time.Since(failedOver)
	got := uniqueIDs(t, b)
	for _, m := range want {
		require.True(t, got[m.ID.String()], "event %s lost", m.ID)
	}
	require.Len(t, got, len(want))
	require.Zero(t, metricValue(t, reg, "oncekit_outbox_logical_slot_lost"))
	var timeline int64
	require.Eventually(t, func() bool {
		return b.db.Pool.QueryRow(context.Background(), `SELECT coalesce(timeline, 0) FROM logical_slots`).Scan(&timeline) == nil && timeline == 2
	}, 30*time.Second, 20*time.Millisecond, "the relay records the slot on the new timeline")
	t.Logf("all %d events published %v after the promotion (%d messages in the stream)", len(want), took.Round(time.Millisecond), streamCount(t, b.stream))
	stop()

	// A relay started later on the promoted server streams on: the slot,
	// recorded on the new timeline, is not taken for one made there.
	pub2, _ := publisher(t, br.url)
	b.startLogicalRelay(t, pub2, outbox.LogicalRelayConfig{})
	add(1, 0, onPrimary)
	require.Eventually(t, func() bool { return len(uniqueIDs(t, b)) == len(want) }, 30*time.Second, 50*time.Millisecond,
		"a relay started after the failover publishes")
}

// A relay's stream restarts within its lease, and the lease's own
// connection outlives the failover's cut by up to a StatusInterval (the
// heartbeat finds it broken). The stream must not start again on the
// promoted server within that lease: there it would move the slot past the
// switch point before a new lease recorded the new timeline, and the next
// lease would take the slot for one made anew and stop the relay. With a
// StatusInterval of 10 s, the stream's restart reaches the promoted server
// seconds before the heartbeat's next tick: the lease ends at once instead,
// and the next one keeps the slot.
func TestLogicalRelayStreamsOnAPromotedServerOnlyInANewLease(t *testing.T) {
	t.Parallel()
	rig := newFailoverRig(t, true)
	b := rig.b
	pub, _ := publisher(t, b.nats.URL)
	_, reg := b.startLogicalRelay(t, pub, outbox.LogicalRelayConfig{StatusInterval: 10 * time.Second})
	var want []broker.Message
	add := func(n int) {
		for range n {
			m := b.msg(fmt.Sprintf("k%d", len(want)%5), len(want))
			enqueueRetrying(t, b, m)
			want = append(want, m)
		}
	}
	add(20)
	waitCount(t, b.stream, 20, 30*time.Second)
	require.Eventually(t, func() bool {
		var synced bool
		query(t, rig.standby, `SELECT count(*) = 1 FROM pg_replication_slots WHERE slot_name = $1 AND synced AND NOT temporary`,
			[]any{"oncekit_" + b.db.Schema}, &synced)
		return synced
	}, 60*time.Second, 50*time.Millisecond, "the standby syncs its copy of the slot")
	rig.waitReplayed(t)
	rig.failover(t)
	add(20)
	require.Eventually(t, func() bool { return len(uniqueIDs(t, b)) >= len(want) }, 60*time.Second, 50*time.Millisecond,
		"every event reaches the stream")
	var timeline int64
	require.Eventually(t, func() bool {
		return b.db.Pool.QueryRow(context.Background(), `SELECT coalesce(timeline, 0) FROM logical_slots`).Scan(&timeline) == nil && timeline == 2
	}, 30*time.Second, 20*time.Millisecond, "a lease records the slot on the new timeline")
	add(1)
	require.Eventually(t, func() bool { return len(uniqueIDs(t, b)) == len(want) }, 30*time.Second, 50*time.Millisecond,
		"the relay streams on after the failover")
	require.Zero(t, metricValue(t, reg, "oncekit_outbox_logical_slot_lost"))
}
