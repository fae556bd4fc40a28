package outbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/pgsql"
)

// SlotStatus is the state of the replication slot a LogicalRelay streams
// from (Config.Slot), as PostgreSQL reports it: the one read that status,
// the console, drift and the relay's gauges share.
type SlotStatus struct {
	// Name is the slot's (and the publication's) name.
	Name string `json:"name"`
	// SetUp says that logical mode was set up for the schema: the slot,
	// its publication or its row in logical_slots exists (SetUpLogical
	// creates all three; the schema's owner may create the publication
	// beforehand). Without it the schema runs the polling relay and the
	// other fields are zero.
	SetUp bool `json:"set_up"`
	// Exists says that the slot exists. A slot missing while CreatedAt is
	// set was dropped: Lost is then set. A publication without its slot
	// and without CreatedAt waits for its first relay, which creates the
	// slot.
	Exists bool `json:"exists"`
	// CreatedAt is when SetUpLogical created the slot, from its row in the
	// schema's logical_slots table, which outlives the slot; nil when
	// oncekit never recorded creating it.
	CreatedAt *time.Time `json:"created_at,omitempty"`
	// Active says that a relay streams from the slot now.
	Active bool `json:"active"`
	// WALStatus is PostgreSQL's wal_status: reserved, extended, unreserved
	// (past max_slot_wal_keep_size, about to be invalidated) or lost.
	WALStatus string `json:"wal_status,omitempty"`
	// Lost says that the slot can no longer be streamed from: dropped
	// (CreatedAt is set and the slot is gone) or invalidated (wal_status lost,
	// its WAL removed after it passed max_slot_wal_keep_size). Events
	// enqueued since its confirmed position may never be published; the
	// relay stops with a *SlotLostError.
	Lost bool `json:"lost"`
	// ConfirmedLSN is the position the relay confirmed (every event
	// committed before it was published), RestartLSN the oldest WAL the
	// slot keeps. Empty when unknown.
	ConfirmedLSN string `json:"confirmed_flush_lsn,omitempty"`
	RestartLSN   string `json:"restart_lsn,omitempty"`
	// LagBytes is the WAL written since ConfirmedLSN: what the relay has
	// yet to read and confirm (pg_current_wal_lsn() - confirmed_flush_lsn).
	LagBytes int64 `json:"lag_bytes"`
	// RetainedBytes is the WAL the slot keeps on the server's disk
	// (pg_current_wal_lsn() - restart_lsn).
	RetainedBytes int64 `json:"retained_bytes"`
	// SafeWALBytes is how much more WAL may be written before the slot is
	// invalidated (safe_wal_size); nil when max_slot_wal_keep_size is -1
	// (no limit: the slot may fill the disk).
	SafeWALBytes *int64 `json:"safe_wal_bytes,omitempty"`
	// LagSeconds is the slot's lag in time, nil when unknown. While a
	// relay streams it is PostgreSQL's own measure (pg_stat_replication's
	// flush_lag: from a WAL position's write to the relay's confirmation of
	// it; zero once the relay is caught up; it grows while the relay keeps
	// reporting and cannot publish). For an inactive slot holding WAL it is
	// at least the time since the slot went inactive (inactive_since,
	// PostgreSQL 17); before 17 it is unknown. It is nil too for a role that
	// may not read other sessions' replication statistics (grant it
	// pg_read_all_stats).
	LagSeconds *float64 `json:"lag_seconds,omitempty"`
	// Standby is a standby's copy of the slot, when the caller read one
	// (StandbySlotStatus; oncekit status --standby-url); SlotStatus leaves
	// it nil.
	Standby *StandbySlot `json:"standby,omitempty"`
}

// Behind says that the slot holds something back: WAL not yet confirmed,
// or a lost slot. A schema in logical mode is behind by this, whatever its
// outbox table holds.
func (s SlotStatus) Behind() bool { return s.Lost || (s.Exists && s.LagBytes > 0) }

// slotStatusSQL reads the slot named $1, its publication and its row in
// logical_slots in one statement. The server's position on a standby is its replay position.
// inactive_since (PostgreSQL 17) is read through to_jsonb so that one
// statement serves every version.
const slotStatusSQL = `
WITH pos AS (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END AS lsn)
SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = $1),
	(SELECT created_at FROM {schema}.logical_slots WHERE slot = $1),
	s.slot_name IS NOT NULL, coalesce(s.active, false), coalesce(s.wal_status, ''),
	coalesce(s.confirmed_flush_lsn::text, ''), coalesce(s.restart_lsn::text, ''),
	coalesce(greatest(p.lsn - s.confirmed_flush_lsn, 0)::int8, 0), coalesce(greatest(p.lsn - s.restart_lsn, 0)::int8, 0),
	s.safe_wal_size,
	CASE WHEN s.active THEN (SELECT coalesce(extract(epoch FROM r.flush_lag)::float8, 0)
			FROM pg_stat_replication r WHERE r.pid = s.active_pid AND r.state IS NOT NULL)
		WHEN p.lsn > s.confirmed_flush_lsn THEN extract(epoch FROM now() - (to_jsonb(s)->>'inactive_since')::timestamptz)::float8
	END
FROM pos p LEFT JOIN pg_replication_slots s ON s.slot_name = $1 AND s.slot_type = 'logical'`

// SlotStatus reads the state of the outbox's replication slot
// (Config.Slot), its publication and its row in logical_slots. A role
// needs SELECT on logical_slots (the console, drift and logical-relay
// grants have it; lag in time needs pg_read_all_stats), in a read-only transaction too, on a primary
// or a standby. A schema without logical mode gets SetUp false.
func (o *Outbox) SlotStatus(ctx context.Context, q oncekit.Querier) (SlotStatus, error) {
	s := SlotStatus{Name: o.slot}
	var pub bool
	err := q.QueryRow(ctx, pgsql.Render(slotStatusSQL, o.schema), o.slot).Scan(&pub, &s.CreatedAt, &s.Exists, &s.Active, &s.WALStatus,
		&s.ConfirmedLSN, &s.RestartLSN, &s.LagBytes, &s.RetainedBytes, &s.SafeWALBytes, &s.LagSeconds)
	if err != nil {
		return SlotStatus{}, fmt.Errorf("outbox: read the replication slot %q: %w", o.slot, err)
	}
	s.SetUp = pub || s.Exists || s.CreatedAt != nil
	s.Lost = (s.CreatedAt != nil && !s.Exists) || s.WALStatus == "lost"
	if s.WALStatus == "lost" {
		s.LagBytes, s.RetainedBytes = 0, 0 // its WAL is gone
	}
	return s, nil
}

// ErrSlotLost is wrapped by the *SlotLostError a LogicalRelay stops with
// (and SetUpLogical returns) when its slot was dropped, invalidated or
// replaced by another.
var ErrSlotLost = errors.New("outbox: the logical relay's replication slot is lost")

// SlotLostError says why the slot cannot be streamed from. The relay does
// not stream from a new slot in its place: the events committed between
// the last confirmed position and the new slot's creation would never be
// published, silently.
type SlotLostError struct {
	// Slot is the slot's name.
	Slot string
	// Reason is "dropped", "invalidated", "replaced" or "failover" (the
	// slot is missing on a server promoted since the relay last recorded
	// it: PostgreSQL before 17, or a standby without a ready copy).
	Reason string
	// Confirmed is the last position known confirmed, when known: events
	// committed after it may be missing from the stream.
	Confirmed string
	// ConfirmedAt is when the relay recorded Confirmed in logical_slots,
	// when that record is what Confirmed comes from: the events enqueued
	// since may be missing.
	ConfirmedAt time.Time
	// Created is when SetUpLogical created the slot (its row in
	// logical_slots), when known.
	Created time.Time
	// After a failover (Reason "failover", or "replaced" by a slot made
	// on the promoted server): the timeline the relay last recorded the
	// slot on, the server's timeline now, and the position where the
	// recorded timeline ended (SwitchLSN, empty when unknown). The events
	// that may be missing were committed between Confirmed and SwitchLSN.
	FromTimeline, ToTimeline int64
	SwitchLSN                string
}

// Error implements error.
func (e *SlotLostError) Error() string {
	var what string
	switch e.Reason {
	case "dropped":
		when := ""
		if !e.Created.IsZero() {
			when = " on " + e.Created.UTC().Format(time.RFC3339)
		}
		what = fmt.Sprintf("replication slot %q was dropped (oncekit created it%s, as its row in logical_slots records, and it is gone)", e.Slot, when)
	case "invalidated":
		what = fmt.Sprintf("replication slot %q was invalidated (wal_status lost: it held more WAL than max_slot_wal_keep_size and the server removed it)", e.Slot)
	case "failover":
		what = fmt.Sprintf("replication slot %q is not on this server, promoted since the relay last recorded the slot "+
			"(timeline %d became %d%s): before PostgreSQL 17, or without a ready copy on the promoted standby "+
			"(failover slot, sync_replication_slots), no slot survives a failover", e.Slot, e.FromTimeline, e.ToTimeline, e.switched())
	default:
		what = fmt.Sprintf("replication slot %q was replaced by another (its confirmed position moved past what the relay confirmed)", e.Slot)
		if e.ToTimeline > e.FromTimeline {
			what = fmt.Sprintf("replication slot %q was made anew on this server after a failover (timeline %d became %d%s; "+
				"the slot's position is past the switch)", e.Slot, e.FromTimeline, e.ToTimeline, e.switched())
		}
	}
	since := "its last confirmed position"
	if e.Confirmed != "" {
		since = e.Confirmed
	}
	if !e.ConfirmedAt.IsZero() {
		since += " (recorded " + e.ConfirmedAt.UTC().Format(time.RFC3339) + ")"
	}
	if e.SwitchLSN != "" {
		since += " and up to the failover at " + e.SwitchLSN
	}
	return fmt.Sprintf("%v: %s; events committed after %s may never be published, and the relay will not stream from a new slot. "+
		"Publish what is missing again from the business data (or accept its loss), then drop the slot if it is left "+
		"(SELECT pg_drop_replication_slot('%s')) and its row (DELETE FROM logical_slots WHERE slot = '%s', in the outbox's schema), "+
		"and start the relay again: it creates the slot anew (docs/runbook.md#oncekitoutboxslotlost)",
		ErrSlotLost, what, since, e.Slot, e.Slot)
}

func (e *SlotLostError) switched() string {
	if e.SwitchLSN == "" {
		return ""
	}
	return " at " + e.SwitchLSN
}

// Unwrap returns ErrSlotLost.
func (e *SlotLostError) Unwrap() error { return ErrSlotLost }

// slotLost returns the *SlotLostError s calls for, or nil. known is the
// highest position the relay knows the slot confirmed (0 before the
// first read in a lease).
func slotLost(s SlotStatus, known pglogrepl.LSN) error {
	lost := func(reason string) error {
		c := s.ConfirmedLSN
		if known > 0 {
			c = known.String()
		}
		lost := &SlotLostError{Slot: s.Name, Reason: reason, Confirmed: c}
		if s.CreatedAt != nil {
			lost.Created = *s.CreatedAt
		}
		return lost
	}
	switch {
	case !s.Exists && (s.CreatedAt != nil || known > 0):
		return lost("dropped")
	case s.WALStatus == "lost":
		return lost("invalidated")
	case known > 0 && s.ConfirmedLSN != "":
		if c, err := pglogrepl.ParseLSN(s.ConfirmedLSN); err == nil && c > known {
			return lost("replaced")
		}
	}
	return nil
}

// refreshSlot reads the slot's status into the relay's gauges and returns
// a *SlotLostError when the slot is lost. holding says that the relay
// holds the lease: then the slot's confirmed position must not pass what
// the relay confirmed (the first read in a lease sets that baseline).
// A failed read is logged and returned.
func (r *LogicalRelay) refreshSlot(ctx context.Context, holding bool) error {
	s, err := r.ob.SlotStatus(ctx, r.pool)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("replication slot status not read", "err", err)
		}
		return err
	}
	r.m.lag.Set(float64(s.LagBytes))
	r.m.retained.Set(float64(s.RetainedBytes))
	r.m.active.Set(b2f(s.Active))
	r.refreshStandby(ctx, s)
	if s.LagSeconds != nil {
		r.m.lagSeconds.Set(*s.LagSeconds)
	} else {
		r.m.lagSeconds.Set(math.NaN())
	}
	var known pglogrepl.LSN
	if holding {
		known = pglogrepl.LSN(r.known.Load()) // loaded after the read: it only grows
	}
	if lost := slotLost(s, known); lost != nil {
		r.m.lost.Set(1)
		return lost
	}
	r.m.lost.Set(0)
	if c, err := pglogrepl.ParseLSN(s.ConfirmedLSN); err == nil && holding {
		if known == 0 {
			r.noteConfirmed(c)
		}
		r.recordSlot(ctx, c)
	}
	return nil
}

// noteConfirmed raises the position the relay knows its slot confirmed
// to pos.
func (r *LogicalRelay) noteConfirmed(pos pglogrepl.LSN) {
	for {
		old := r.known.Load()
		if uint64(pos) <= old || r.known.CompareAndSwap(old, uint64(pos)) {
			return
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
