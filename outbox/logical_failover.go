package outbox

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit/internal/pgsql"
)

// serverIdentity is the server a LogicalRelay streams from, as
// IDENTIFY_SYSTEM reports it: a promoted standby keeps its primary's system
// identifier on a timeline of its own.
type serverIdentity struct {
	systemID string
	timeline int64
	database string
}

// slotMark is the slot's row in logical_slots: its creation and where the
// relay last recorded it standing.
type slotMark struct {
	created   *time.Time
	confirmed *string
	at        *time.Time
	timeline  *int64
	systemID  *string
}

const (
	slotMarkSQL = `SELECT created_at, confirmed_lsn::text, confirmed_at, timeline, system_id
		FROM {schema}.logical_slots WHERE slot = $1`
	slotRecordSQL = `UPDATE {schema}.logical_slots
		SET confirmed_lsn = $2::text::pg_lsn, confirmed_at = now(), timeline = $3, system_id = $4 WHERE slot = $1`
)

// slotRecord is what the relay last wrote into logical_slots within its
// lease.
type slotRecord struct {
	mu  sync.Mutex
	id  serverIdentity // the lease's server; zero: nothing is recorded
	lsn pglogrepl.LSN
	at  time.Time
}

// checkFailover identifies the server at the start of a lease and compares
// it with the slot's row: when the server was promoted (same system, a
// later timeline) since the relay recorded the slot, the slot must be the
// copy a standby kept (at or before the timeline's switch point), else the
// events committed between the recorded position and the switch may never
// be decoded and it returns a *SlotLostError naming that window.
func (r *LogicalRelay) checkFailover(ctx context.Context) (serverIdentity, error) {
	var m slotMark
	err := r.pool.QueryRow(ctx, pgsql.Render(slotMarkSQL, r.ob.schema), r.ob.slot).
		Scan(&m.created, &m.confirmed, &m.at, &m.timeline, &m.systemID)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return serverIdentity{}, fmt.Errorf("outbox: read the slot's record: %w", err)
	}
	var since int64
	if m.confirmed != nil && m.timeline != nil {
		since = *m.timeline
	}
	id, switched, err := r.identify(ctx, since)
	if err != nil {
		return serverIdentity{}, err
	}
	if err := r.sameDatabase(ctx, id); err != nil {
		return serverIdentity{}, err
	}
	if since == 0 || m.systemID == nil || *m.systemID != id.systemID || id.timeline <= since {
		return id, nil // nothing recorded, another cluster (rebase's business), or no failover since
	}
	recorded, err := pglogrepl.ParseLSN(*m.confirmed)
	if err != nil {
		return id, fmt.Errorf("outbox: the slot's record: %w", err)
	}
	s, err := r.ob.SlotStatus(ctx, r.pool)
	if err != nil {
		return id, err
	}
	lost := &SlotLostError{Slot: r.ob.slot, Reason: "failover", Confirmed: recorded.String(), FromTimeline: since, ToTimeline: id.timeline}
	if m.at != nil {
		lost.ConfirmedAt = *m.at
	}
	if m.created != nil {
		lost.Created = *m.created
	}
	if switched > 0 {
		lost.SwitchLSN = switched.String()
	}
	if !s.Exists {
		return id, lost
	}
	pos, err := pglogrepl.ParseLSN(s.ConfirmedLSN)
	if err == nil && switched > 0 && pos > switched {
		// A copy synced from the old primary stands at or before the
		// point where the standby's replay of it ended.
		lost.Reason = "replaced"
		return id, lost
	}
	if switched > 0 && recorded > switched {
		r.log.Warn("the relay had published events committed after the failover's switch point, which the promoted server does not have "+
			"(was synchronized_standby_slots set on the old primary?)", "switch_lsn", switched.String(), "recorded_lsn", recorded.String())
	}
	// Recorded on the new timeline before the relay streams past the
	// switch: else a later lease would take the slot for one made anew.
	if _, err := r.pool.Exec(ctx, pgsql.Render(slotRecordSQL, r.ob.schema), r.ob.slot, s.ConfirmedLSN, id.timeline, id.systemID); err != nil {
		return id, fmt.Errorf("outbox: record the slot on the new timeline: %w", err)
	}
	r.log.Info("the slot was kept across a failover; streaming from its copy (events after its position are published again)",
		"from_timeline", since, "to_timeline", id.timeline, "switch_lsn", lost.SwitchLSN, "slot_lsn", s.ConfirmedLSN, "recorded_lsn", recorded.String())
	return id, nil
}

// errServerChanged ends a lease whose replication connection reaches
// another server than the one the lease began on: a standby promoted since
// (the lease's own connection, to the old primary, may not have failed yet).
// Streaming there within the lease would move the slot past the failover's
// switch point before the next lease's checkFailover has recorded the new
// timeline, and that lease would take the slot for one made anew.
var errServerChanged = errors.New("outbox: the replication connection reaches another server than the lease began on")

// sameServer checks, on a replication connection, that the server is the
// lease's: same system, same timeline.
func sameServer(ctx context.Context, conn *pgconn.PgConn, lease serverIdentity) error {
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return fmt.Errorf("identify the server: %w", err)
	}
	if sys.SystemID != lease.systemID || int64(sys.Timeline) != lease.timeline {
		return fmt.Errorf("%w (timeline %d, now %d): a new lease checks the failover", errServerChanged, lease.timeline, sys.Timeline)
	}
	return nil
}

// identify runs IDENTIFY_SYSTEM over a replication connection and, when the server's timeline is past since (> 0), reads
// its history for the position where timeline since ended (0 if it is not
// there).
func (r *LogicalRelay) identify(ctx context.Context, since int64) (serverIdentity, pglogrepl.LSN, error) {
	conn, err := r.connectReplication(ctx)
	if err != nil {
		return serverIdentity{}, 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return serverIdentity{}, 0, fmt.Errorf("identify the server: %w", err)
	}
	id := serverIdentity{systemID: sys.SystemID, timeline: int64(sys.Timeline), database: sys.DBName}
	if since == 0 || id.timeline <= since {
		return id, 0, nil
	}
	h, err := pglogrepl.TimelineHistory(ctx, conn, sys.Timeline)
	if err != nil {
		return id, 0, fmt.Errorf("read the server's timeline history: %w", err)
	}
	return id, switchPoint(h.Content, since), nil
}

// switchPoint reads a timeline history file ("parent TLI, tab, switch
// LSN, tab, reason" a line) for where timeline tli ended; 0 when it is not
// there.
func switchPoint(history []byte, tli int64) pglogrepl.LSN {
	sc := bufio.NewScanner(bytes.NewReader(history))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) < 2 {
			continue
		}
		if n, err := strconv.ParseInt(string(f[0]), 10, 64); err != nil || n != tli {
			continue
		}
		if lsn, err := pglogrepl.ParseLSN(string(f[1])); err == nil {
			return lsn
		}
	}
	return 0
}

// recordSlot writes where the slot stands (pos, its confirmed position)
// into its row in logical_slots, at most once a StatusInterval and only
// when it moved: the record a promoted server has of it.
func (r *LogicalRelay) recordSlot(ctx context.Context, pos pglogrepl.LSN) {
	rec := &r.record
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.id.timeline == 0 || pos == 0 || pos == rec.lsn || time.Since(rec.at) < r.cfg.StatusInterval*9/10 && rec.lsn != 0 {
		return
	}
	_, err := r.pool.Exec(ctx, pgsql.Render(slotRecordSQL, r.ob.schema), r.ob.slot, pos.String(), rec.id.timeline, rec.id.systemID)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("the slot's position not recorded in logical_slots", "err", err)
		}
		return
	}
	rec.lsn, rec.at = pos, time.Now()
}

// startRecord starts the lease's records on server id; endRecord ends them.
func (r *LogicalRelay) startRecord(id serverIdentity) {
	r.record.mu.Lock()
	r.record.id, r.record.lsn, r.record.at = id, 0, time.Time{}
	r.record.mu.Unlock()
}

func (r *LogicalRelay) endRecord() { r.startRecord(serverIdentity{}) }
