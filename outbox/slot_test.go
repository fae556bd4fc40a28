package outbox_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// runLogicalRelay runs a logical relay and returns the channel its Run's
// error arrives on; the relay is stopped when the test ends.
func (b *bundle) runLogicalRelay(t *testing.T, pub broker.Publisher, cfg outbox.LogicalRelayConfig) (<-chan error, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Logger, cfg.Registerer = testLogger(), reg
	cfg.StatusInterval = max(cfg.StatusInterval, 200*time.Millisecond)
	cfg.Table.Lease, cfg.Table.PollInterval = 2*time.Second, 100*time.Millisecond
	r, err := outbox.NewLogicalRelay(b.db.Pool, b.ob, pub, &cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done, finished := make(chan error, 1), make(chan struct{})
	go func() { done <- r.Run(ctx); close(finished) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-finished:
		case <-time.After(30 * time.Second):
			t.Error("logical relay did not stop")
		}
	})
	return done, reg
}

// slotStatus reads the bundle's slot through the outbox.
func (b *bundle) slotStatus(t *testing.T) outbox.SlotStatus {
	t.Helper()
	s, err := b.ob.SlotStatus(context.Background(), b.db.Pool)
	require.NoError(t, err)
	return s
}

// waitSlotLost waits for Run to return and requires a *SlotLostError of
// reason.
func waitSlotLost(t *testing.T, done <-chan error, reason string) *outbox.SlotLostError {
	t.Helper()
	var err error
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the relay still runs on a lost slot")
	}
	require.ErrorIs(t, err, outbox.ErrSlotLost)
	var lost *outbox.SlotLostError
	require.ErrorAs(t, err, &lost)
	require.Equal(t, reason, lost.Reason, "%v", err)
	t.Logf("Run returned: %v", err)
	return lost
}

// streaming waits until the relay streams from the slot and has confirmed
// past one published message.
func (b *bundle) streaming(t *testing.T) {
	t.Helper()
	enqueue(t, b.db, b.ob, b.msg("k", 0))
	waitCount(t, b.stream, 1, 20*time.Second)
	require.Eventually(t, func() bool { return b.slotStatus(t).Active && slotConfirmed(t, b) > 0 },
		20*time.Second, 20*time.Millisecond, "the relay streams from the slot")
}

// evictSlot ends the relay's replication session and runs then (dropping
// the slot) as soon as the slot is free: the relay takes it back after a
// pause, so both are tried again until then succeeds.
func (b *bundle) evictSlot(t *testing.T, then string) {
	t.Helper()
	ctx := context.Background()
	slot := "oncekit_" + b.db.Schema
	require.Eventually(t, func() bool {
		_, _ = b.db.Pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
			WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot)
		_, err := b.db.Pool.Exec(ctx, then)
		return err == nil
	}, 20*time.Second, 5*time.Millisecond, "the slot is dropped")
}

// A slot dropped under a running relay: the relay stops with a
// *SlotLostError naming the slot instead of creating a new one (which
// would skip what the old one held), and a relay started afterwards, or
// SetUpLogical, refuses likewise.
func TestLogicalRelayStopsWhenItsSlotIsDropped(t *testing.T) {
	t.Parallel()
	b := logicalSetup(t)
	pub, _ := publisher(t, b.nats.URL)
	done, reg := b.runLogicalRelay(t, pub, outbox.LogicalRelayConfig{})
	b.streaming(t)
	slot := "oncekit_" + b.db.Schema
	require.Eventually(t, func() bool { return metricValue(t, reg, "oncekit_outbox_logical_slot_active") == 1 },
		20*time.Second, 20*time.Millisecond)

	b.evictSlot(t, `SELECT pg_drop_replication_slot('`+slot+`')`)
	lost := waitSlotLost(t, done, "dropped")
	require.Equal(t, slot, lost.Slot)
	require.Contains(t, lost.Error(), `replication slot "`+slot+`" was dropped`)
	require.Equal(t, 1.0, metricValue(t, reg, "oncekit_outbox_logical_slot_lost"))
	s := b.slotStatus(t)
	require.False(t, s.Exists, "the relay made no new slot")
	require.True(t, s.Lost && s.Behind(), "status sees the slot lost: %+v", s)

	again, _ := b.runLogicalRelay(t, pub, outbox.LogicalRelayConfig{})
	waitSlotLost(t, again, "dropped")
	require.ErrorIs(t, b.ob.SetUpLogical(context.Background(), b.db.Pool), outbox.ErrSlotLost)
	require.False(t, b.slotStatus(t).Exists, "nothing made a new slot")
}

// A slot dropped and made again under the same name while the relay holds
// the lease: the relay stops rather than stream from the new one, having
// seen it either missing (the new slot waits for running transactions
// before it exists) or past what the relay confirmed.
func TestLogicalRelayStopsWhenItsSlotIsReplaced(t *testing.T) {
	t.Parallel()
	b := logicalSetup(t)
	pub, _ := publisher(t, b.nats.URL)
	done, _ := b.runLogicalRelay(t, pub, outbox.LogicalRelayConfig{})
	b.streaming(t)
	slot := "oncekit_" + b.db.Schema
	b.evictSlot(t, `SELECT pg_drop_replication_slot('`+slot+`'); SELECT pg_create_logical_replication_slot('`+slot+`', 'pgoutput')`)
	var err error
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the relay still runs on a replaced slot")
	}
	var lost *outbox.SlotLostError
	require.ErrorAs(t, err, &lost)
	require.Contains(t, []string{"dropped", "replaced"}, lost.Reason)
	t.Logf("Run returned: %v", err)
	s := b.slotStatus(t)
	require.True(t, s.Exists && !s.Active, "the new slot is left alone: %+v", s)
}

// A slot moved past what the relay confirmed while the relay holds the
// lease (pg_replication_slot_advance by hand: what it skipped is lost to
// the stream): the relay stops with reason "replaced".
func TestLogicalRelayStopsWhenItsSlotIsMovedPastItsPosition(t *testing.T) {
	t.Parallel()
	b := logicalSetup(t)
	pub, _ := publisher(t, b.nats.URL)
	done, _ := b.runLogicalRelay(t, pub, outbox.LogicalRelayConfig{})
	b.streaming(t)
	slot := "oncekit_" + b.db.Schema
	b.evictSlot(t, `SELECT pg_logical_emit_message(false, 'filler', 'x'); SELECT pg_replication_slot_advance('`+slot+`', pg_current_wal_lsn())`)
	lost := waitSlotLost(t, done, "replaced")
	require.Contains(t, lost.Error(), "was replaced by another (its confirmed position moved past what the relay confirmed)")
}

// A slot invalidated by max_slot_wal_keep_size while its relay streams
// and cannot publish (the broker is down, so nothing is confirmed): the
// server removes its WAL and ends the relay's session, and the relay stops
// with a *SlotLostError (wal_status lost) instead of looping on the
// server's refusals.
func TestLogicalRelayStopsWhenItsSlotIsInvalidated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := pgcluster.StartForTest(ctx, t, pgcluster.Options{
		Settings: "wal_level = logical\nmax_slot_wal_keep_size = 1MB\nwal_keep_size = 0\nfsync = off\n"})
	b := setupDB(t, testenv.NewDBOn(t, pg.URL("postgres")))
	b.ob = newOutbox(t, b.db, outbox.Config{Logical: true})
	require.NoError(t, b.ob.SetUpLogical(ctx, b.db.Pool))
	br := restartableBroker(t, b)
	pub, _ := publisher(t, br.url)
	done, reg := b.runLogicalRelay(t, pub, outbox.LogicalRelayConfig{PublishTimeout: 500 * time.Millisecond})
	b.streaming(t)

	br.stop()
	enqueue(t, b.db, b.ob, b.msg("k", 1))
	require.Eventually(t, func() bool {
		return metricValue(t, reg, "oncekit_outbox_logical_publish_failures_total") >= 1
	}, 30*time.Second, 20*time.Millisecond, "the relay holds an event it cannot publish")
	require.Eventually(t, func() bool {
		// Segments written past the slot's restart position, then a
		// checkpoint, which invalidates a slot past the limit.
		for range 3 {
			_, err := b.db.Pool.Exec(ctx, `SELECT pg_logical_emit_message(false, 'filler', 'x'); SELECT pg_switch_wal()`)
			require.NoError(t, err)
		}
		_, err := b.db.Pool.Exec(ctx, `CHECKPOINT`)
		require.NoError(t, err)
		return b.slotStatus(t).WALStatus == "lost"
	}, 30*time.Second, 50*time.Millisecond, "the slot is invalidated")
	lost := waitSlotLost(t, done, "invalidated")
	require.Contains(t, lost.Error(), "max_slot_wal_keep_size")
	require.Equal(t, 1.0, metricValue(t, reg, "oncekit_outbox_logical_slot_lost"))
	require.True(t, b.slotStatus(t).Lost)
}

// SlotStatus of a running relay's slot: active, lag and WAL retained as the
// server counts them; of a schema without logical mode: not set up.
func TestSlotStatusFollowsTheRelay(t *testing.T) {
	t.Parallel()
	b := logicalSetup(t)
	ctx := context.Background()
	s := b.slotStatus(t)
	require.True(t, s.SetUp && s.Exists && !s.Active && !s.Lost, "%+v", s)
	_, err := b.db.Pool.Exec(ctx, `CREATE TABLE filler (n int); INSERT INTO filler SELECT generate_series(1, 10000)`)
	require.NoError(t, err)
	s = b.slotStatus(t)
	require.Positive(t, s.LagBytes, "WAL written and not confirmed is behind")
	require.GreaterOrEqual(t, s.RetainedBytes, s.LagBytes)
	require.True(t, s.Behind())
	require.Nil(t, s.LagSeconds, "an inactive slot's lag in time is unknown before PostgreSQL 17")

	pub, _ := publisher(t, b.nats.URL)
	_, reg := b.runLogicalRelay(t, pub, outbox.LogicalRelayConfig{})
	b.streaming(t)
	require.Eventually(t, func() bool {
		s = b.slotStatus(t)
		return s.Active && s.LagSeconds != nil && metricValue(t, reg, "oncekit_outbox_logical_slot_active") == 1 &&
			!math.IsNaN(metricValue(t, reg, "oncekit_outbox_logical_slot_lag_seconds"))
	}, 20*time.Second, 20*time.Millisecond, "the streaming slot is active, its lag in time known: %+v", s)
	require.Zero(t, metricValue(t, reg, "oncekit_outbox_logical_slot_lost"))

	none := newOutbox(t, b.db, outbox.Config{Slot: "never_set_up"})
	s, err = none.SlotStatus(ctx, b.db.Pool)
	require.NoError(t, err)
	require.Equal(t, outbox.SlotStatus{Name: "never_set_up"}, s)
	require.False(t, s.Behind())
}

// While the relay streams and cannot publish (the broker is down), the
// slot's lag in time grows with the wait: PostgreSQL measures it from the
// WAL the relay has read and not confirmed.
func TestSlotLagInTimeGrowsWhileTheRelayCannotPublish(t *testing.T) {
	t.Parallel()
	b := logicalSetup(t)
	br := restartableBroker(t, b)
	pub, _ := publisher(t, br.url)
	_, reg := b.runLogicalRelay(t, pub, outbox.LogicalRelayConfig{PublishTimeout: 500 * time.Millisecond})
	b.streaming(t)
	br.stop()
	enqueue(t, b.db, b.ob, b.msg("k", 1))
	var s outbox.SlotStatus
	require.Eventually(t, func() bool {
		s = b.slotStatus(t)
		return s.Active && s.LagSeconds != nil && *s.LagSeconds >= 3 && s.LagBytes > 0
	}, 30*time.Second, 100*time.Millisecond, "the lag in time grows: %+v", s)
	t.Logf("broker down: lag %d bytes, %.1f s", s.LagBytes, *s.LagSeconds)
	require.Eventually(t, func() bool { return metricValue(t, reg, "oncekit_outbox_logical_slot_lag_seconds") >= 3 },
		30*time.Second, 100*time.Millisecond)
}
