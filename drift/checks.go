package drift

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/outbox"
)

// check is one query yielding a figure.
type check struct {
	name  string
	limit float64
	run   func(ctx context.Context, db oncekit.Querier) (Finding, error)
}

// backlog is a check on the outbox's unpublished rows, whose state follows
// from the relay's cursors: the outbox package holds that query.
func backlog(name string, limit float64, schema string, figure func(outbox.Backlog) float64) check {
	ob, err := outbox.New(&outbox.Config{Schema: schema})
	return check{name: name, limit: limit, run: func(ctx context.Context, db oncekit.Querier) (Finding, error) {
		if err != nil {
			return Finding{}, err
		}
		b, err := ob.Backlog(ctx, db)
		if err != nil {
			return Finding{}, err
		}
		v := figure(b)
		return Finding{Value: v, Limit: limit, Drift: v > limit}, nil
	}}
}

func secs(d time.Duration) float64 { return d.Seconds() }

// slot is a check on the logical relay's replication slot, which the
// outbox reads: a schema without logical mode set up yields 0. A lost
// slot is drift whatever the figure, with an example saying why.
func slot(name string, limit float64, c Config, figure func(outbox.SlotStatus) float64) check {
	ob, err := outbox.New(&outbox.Config{Schema: c.Schema, Slot: c.Slot})
	return check{name: name, limit: limit, run: func(ctx context.Context, db oncekit.Querier) (Finding, error) {
		if err != nil {
			return Finding{}, err
		}
		s, err := ob.SlotStatus(ctx, db)
		if err != nil {
			return Finding{}, err
		}
		v := figure(s)
		f := Finding{Value: v, Limit: limit, Drift: v > limit}
		switch {
		case s.Lost:
			f.Drift = true
			f.Examples = []string{fmt.Sprintf("replication slot %s is lost (exists %v, wal_status %q): the logical relay stops; docs/runbook.md",
				s.Name, s.Exists, s.WALStatus)}
		case f.Drift:
			f.Examples = []string{fmt.Sprintf("replication slot %s: active %v, lag %d bytes, WAL retained %d bytes",
				s.Name, s.Active, s.LagBytes, s.RetainedBytes)}
		}
		return f, nil
	}}
}

// listed is a check whose SQL returns one row (id, label) per offending
// row: the value is their count, the first MaxIDs are kept as IDs and the
// first few labels as examples.
func listed(name, sql string, c Config, args ...any) check {
	q := pgsql.Render(`SELECT id, label, count(*) OVER () FROM (`+sql+`) AS x(id, label) ORDER BY length(id), id LIMIT `+
		strconv.Itoa(c.MaxIDs), c.Schema)
	return check{name: name, run: func(ctx context.Context, db oncekit.Querier) (Finding, error) {
		rows, err := db.Query(ctx, q, args...)
		if err != nil {
			return Finding{}, err
		}
		defer rows.Close()
		var f Finding
		for rows.Next() {
			var id, label string
			var n int64
			if err := rows.Scan(&id, &label, &n); err != nil {
				return Finding{}, err
			}
			f.IDs = append(f.IDs, id)
			if len(f.Examples) < maxExamples {
				f.Examples = append(f.Examples, label)
			}
			f.Value = float64(n)
		}
		if err := rows.Err(); err != nil {
			return Finding{}, err
		}
		f.Drift = f.Value > 0
		return f, nil
	}}
}

// effectLabel describes a side effect row e in examples.
const effectLabel = `'effect ' || e.id || ' (' || e.kind || ' of ' || e.source_id || ')'`

// builtins are the checks every deployment gets. Each reads through an index
// (or the small partial ones) so that it stays cheap on large tables.
func builtins(c Config) []check {
	s := c.Schema
	return []check{
		backlog("outbox_backlog", float64(c.MaxOutboxBacklog), s,
			func(b outbox.Backlog) float64 { return float64(b.Pending) }),
		backlog("outbox_oldest_age_seconds", secs(c.MaxOutboxAge), s,
			func(b outbox.Backlog) float64 { return b.OldestAge.Seconds() }),
		// Logical mode: the slot's lag, and the WAL an inactive slot
		// keeps (nothing reads it; it fills the primary's disk).
		slot("outbox_slot_lag_bytes", float64(c.MaxSlotLagBytes), c,
			func(s outbox.SlotStatus) float64 { return float64(s.LagBytes) }),
		slot("outbox_slot_inactive_retained_bytes", float64(c.MaxInactiveSlotRetainedBytes), c,
			func(s outbox.SlotStatus) float64 {
				if s.Active {
					return 0
				}
				return float64(s.RetainedBytes)
			}),
		// The predicate of the partial index outbox_blocked, then parked.
		listed("outbox_parked", `SELECT o.id::text, 'message ' || o.id || ' (key ' || quote_literal(o.ordering_key) || ', ' ||
				o.subject || ', ' || o.attempts || ' attempts)'
			FROM {schema}.outbox o WHERE (o.parked_at IS NOT NULL OR o.next_attempt_at IS NOT NULL) AND o.parked_at IS NOT NULL`, c),
		// Fired and pending rows are in the due index; unknown rows sit in
		// it at 'infinity' (migration 007).
		listed("effects_fired_past_lease", `SELECT e.id::text, `+effectLabel+` || ' fired, lease expired ' ||
				to_char(e.lease_expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
			FROM {schema}.side_effects e WHERE e.next_attempt_at IS NOT NULL AND e.state = 'fired'
			AND e.lease_expires_at < now() - make_interval(secs => $1)`, c, secs(c.LeaseGrace)),
		listed("effects_unknown", `SELECT e.id::text, `+effectLabel+` || ': ' || coalesce(e.last_error, 'unknown')
			FROM {schema}.side_effects e WHERE e.next_attempt_at = 'infinity' AND e.state = 'unknown'`, c),
		listed("effects_pending_overdue", `SELECT e.id::text, `+effectLabel+` || ' due ' ||
				to_char(e.next_attempt_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
			FROM {schema}.side_effects e WHERE e.next_attempt_at < now() - make_interval(secs => $1) AND e.state = 'pending'`,
			c, secs(c.MaxPendingAge)),
		// Failed rows left the due index; the BRIN index on created_at
		// bounds the read to the window.
		listed("effects_failed", `SELECT e.id::text, `+effectLabel+` || ': ' || coalesce(e.last_error, 'failed')
			FROM {schema}.side_effects e WHERE e.created_at >= now() - make_interval(secs => $1) AND e.state = 'failed'`,
			c, secs(c.FailedWindow)),
		// Keys are never shown: tenant and operation only.
		listed("idempotency_in_progress_past_lease", `SELECT k.tenant || '/' || k.operation || '/' || md5(k.key),
				'tenant ' || quote_literal(k.tenant) || ', operation ' || quote_literal(k.operation) || ', lease expired ' ||
				to_char(k.locked_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
			FROM {schema}.idempotency_keys k WHERE k.state = 'in_progress' AND k.locked_until IS NOT NULL
			AND k.locked_until < now() - make_interval(secs => $1)`, c, secs(c.LeaseGrace)),
		// Unknown outcomes wait for a reconciliation or an operator
		// (oncekit edge resolve); the partial index idempotency_keys_unsettled.
		listed("idempotency_unknown", `SELECT k.tenant || '/' || k.operation || '/' || k.key,
				'tenant ' || quote_literal(k.tenant) || ', operation ' || quote_literal(k.operation) || ', stored key ' ||
				left(k.key, 16) || ': ' || left(coalesce(k.unknown_reason, 'unknown'), 120)
			FROM {schema}.idempotency_keys k WHERE k.state = 'unknown'`, c),
		listed("dead_letters", `SELECT d.id::text, 'dead letter ' || d.id || ' (consumer ' || d.consumer ||
				', message ' || coalesce(nullif(d.message_id, ''), '-') || '): ' || left(d.reason, 120)
			FROM {schema}.dead_letters d WHERE d.replayed_at IS NULL`, c),
	}
}
