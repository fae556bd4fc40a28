package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"
)

// StandbySlot is a standby's copy of the logical relay's slot: whether a
// failover to that standby keeps the slot (PostgreSQL 17 failover slots,
// synchronized by the standby's sync_replication_slots).
type StandbySlot struct {
	// Exists says that the standby has a slot of the name.
	Exists bool `json:"exists"`
	// Synced says that the copy is synchronized from the primary
	// (pg_replication_slots.synced, PostgreSQL 17; false before).
	Synced bool `json:"synced"`
	// Temporary says that the copy is not persisted yet: the standby
	// has not caught up with the primary slot's position, and a promotion
	// drops it.
	Temporary bool `json:"temporary"`
	// Invalidation is why the copy was invalidated
	// (pg_replication_slots.invalidation_reason), empty when valid.
	Invalidation string `json:"invalidation,omitempty"`
	// ConfirmedLSN is the copy's confirmed position.
	ConfirmedLSN string `json:"confirmed_flush_lsn,omitempty"`
	// LagBytes is how far the copy's confirmed position is behind the
	// primary slot's: what a failover now would publish again.
	LagBytes int64 `json:"lag_bytes"`
	// Ready says that a failover to the standby now keeps the slot: the
	// copy exists, is synced, persisted and valid, and lags the primary's by
	// no more than the relay's StandbyMaxLag.
	Ready bool `json:"ready"`
}

// standbySlotSQL reads the standby's copy of slot $1; the PostgreSQL 17
// columns through to_jsonb, so that an older standby answers (not synced).
const standbySlotSQL = `SELECT coalesce((to_jsonb(s)->>'synced')::bool, false), s.temporary,
	coalesce(to_jsonb(s)->>'invalidation_reason', ''), coalesce(s.confirmed_flush_lsn::text, '')
FROM pg_replication_slots s WHERE s.slot_name = $1 AND s.slot_type = 'logical'`

// StandbySlotStatus reads standby's copy of the outbox's slot and
// compares it with primary, the slot's status on the primary (SlotStatus).
// maxLag is the most bytes the copy may be behind and be Ready.
func (o *Outbox) StandbySlotStatus(ctx context.Context, standby oncekit.Querier, primary SlotStatus, maxLag int64) (StandbySlot, error) {
	var s StandbySlot
	err := standby.QueryRow(ctx, standbySlotSQL, o.slot).Scan(&s.Synced, &s.Temporary, &s.Invalidation, &s.ConfirmedLSN)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, nil
	}
	if err != nil {
		return StandbySlot{}, fmt.Errorf("outbox: read the standby's copy of the replication slot %q: %w", o.slot, err)
	}
	s.Exists = true
	copyPos, err1 := pglogrepl.ParseLSN(s.ConfirmedLSN)
	primaryPos, err2 := pglogrepl.ParseLSN(primary.ConfirmedLSN)
	lagKnown := err1 == nil && err2 == nil
	if lagKnown && primaryPos > copyPos {
		s.LagBytes = int64(primaryPos - copyPos)
	}
	s.Ready = s.Synced && !s.Temporary && s.Invalidation == "" && lagKnown && s.LagBytes <= maxLag
	return s, nil
}

// refreshStandby reads the standby's copy of the slot into the relay's
// gauges: not ready when the standby cannot be read.
func (r *LogicalRelay) refreshStandby(ctx context.Context, primary SlotStatus) {
	if r.cfg.Standby == nil {
		return
	}
	s, err := r.ob.StandbySlotStatus(ctx, r.cfg.Standby, primary, r.cfg.StandbyMaxLag)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("the standby's copy of the replication slot not read", "err", err)
		}
		r.m.standbyReady.Set(0)
		return
	}
	r.m.standbyReady.Set(b2f(s.Ready))
	r.m.standbyLag.Set(float64(s.LagBytes))
}
