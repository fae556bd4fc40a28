package sideeffect

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/pgsql"
)

// The reads operators' tools compose (oncekit status, the console, drift)
// over side_effects: the sideeffect package is the one place that says
// what its rows mean. Each takes the querier to run on, so that a caller's
// figures can come from one transaction, and reads through an index or
// under a limit. Live rows are in the due index on next_attempt_at:
// pending and fired ones at their due time, unknown ones at 'infinity'
// (migrations 007 and 018), where they order by ID.

// KindCount counts one kind's effects by state.
type KindCount struct {
	Kind string
	// Pending counts the pending effects, Overdue those among them past
	// due by CountOptions.Overdue.
	Pending, Overdue int64
	// Fired counts the fired effects, PastLease those among them whose
	// lease expired.
	Fired, PastLease int64
	Unknown          int64
	// Confirmed and Failed count the effects recorded within
	// CountOptions.Recent that settled so.
	Confirmed, Failed int64
}

// CountOptions says what CountByKind counts.
type CountOptions struct {
	// Overdue is how far past due a pending effect counts as overdue.
	Overdue time.Duration
	// Recent is the window of the settled effects counted.
	Recent time.Duration
	// Kinds bounds the kinds returned.
	Kinds int
	// Cap bounds the effects counted: that many due (pending and fired,
	// the earliest due first), that many unknown, and the settled ones
	// among that many newest. A count of every live effect would read
	// each, so an outage that leaves a million effects pending would slow
	// the count to seconds when an operator needs it.
	Cap int
}

// countByKindSQL counts the live effects (pending and fired, then unknown:
// $4 of each at most) through the due index, and the settled ones recorded
// within $2 seconds among the newest $4 effects, through the primary key
// (IDs grow with the time effects are recorded: a walk back from the
// newest stops at the first recorded before the window). The BRIN index
// on created_at would find the recent effects too, but reading it costs a
// summary per 128 pages of the whole table: 0.55 ms at 10M effects, where
// the walk costs a few index pages (decision 025).
const countByKindSQL = `WITH live AS (
		(SELECT kind, state, next_attempt_at, lease_expires_at FROM {schema}.side_effects
			WHERE next_attempt_at IS NOT NULL AND next_attempt_at < 'infinity' ORDER BY next_attempt_at, id LIMIT $4)
		UNION ALL
		(SELECT kind, state, next_attempt_at, lease_expires_at FROM {schema}.side_effects
			WHERE next_attempt_at = 'infinity' ORDER BY next_attempt_at, id LIMIT $4)),
	by_kind AS (
		SELECT kind,
			count(*) FILTER (WHERE state = 'pending') AS pending,
			count(*) FILTER (WHERE state = 'pending' AND next_attempt_at < now() - make_interval(secs => $1)) AS overdue,
			count(*) FILTER (WHERE state = 'fired') AS fired,
			count(*) FILTER (WHERE state = 'fired' AND lease_expires_at < now()) AS past_lease,
			count(*) FILTER (WHERE state = 'unknown') AS unknown
		FROM live GROUP BY kind),
	newest AS (
		SELECT t.hi, coalesce(b.id, t.hi - $4) AS lo,
			b.id IS NULL AND t.hi - $4 >= (SELECT min(id) FROM {schema}.side_effects) AS capped
		FROM (SELECT max(id) AS hi FROM {schema}.side_effects) t
		LEFT JOIN LATERAL (SELECT e.id FROM {schema}.side_effects e
			WHERE e.id > t.hi - $4 AND e.id <= t.hi AND e.created_at < now() - make_interval(secs => $2)
			ORDER BY e.id DESC LIMIT 1) b ON true),
	settled AS (
		SELECT e.kind, count(*) FILTER (WHERE e.state = 'confirmed' AND e.created_at >= now() - make_interval(secs => $2)) AS confirmed,
			count(*) FILTER (WHERE e.state = 'failed' AND e.created_at >= now() - make_interval(secs => $2)) AS failed
		FROM newest n JOIN {schema}.side_effects e ON e.id > n.lo AND e.id <= n.hi
		WHERE e.state IN ('confirmed', 'failed')
		GROUP BY e.kind)
	SELECT coalesce(l.kind, s.kind), coalesce(l.pending, 0), coalesce(l.overdue, 0), coalesce(l.fired, 0),
		coalesce(l.past_lease, 0), coalesce(l.unknown, 0), coalesce(s.confirmed, 0), coalesce(s.failed, 0), coalesce(n.capped, false)
	FROM by_kind l FULL JOIN settled s ON s.kind = l.kind CROSS JOIN newest n ORDER BY 1 LIMIT $3`

// CountByKind counts effects by kind and state, up to o.Kinds kinds in
// kind order, and says whether a count stopped at o.Cap (each figure is
// then at least what it says).
func (l *Ledger) CountByKind(ctx context.Context, q oncekit.Querier, o CountOptions) ([]KindCount, bool, error) {
	rows, err := q.Query(ctx, pgsql.Render(countByKindSQL, l.schema), o.Overdue.Seconds(), o.Recent.Seconds(), o.Kinds, o.Cap)
	if err != nil {
		return nil, false, fmt.Errorf("sideeffect: count by kind: %w", err)
	}
	var capped bool
	counts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (KindCount, error) {
		var k KindCount
		err := r.Scan(&k.Kind, &k.Pending, &k.Overdue, &k.Fired, &k.PastLease, &k.Unknown, &k.Confirmed, &k.Failed, &capped)
		return k, err
	})
	if err != nil {
		return nil, false, fmt.Errorf("sideeffect: count by kind: %w", err)
	}
	var due, unknown int64
	for _, k := range counts {
		due += k.Pending + k.Fired
		unknown += k.Unknown
	}
	return counts, capped || due >= int64(o.Cap) || unknown >= int64(o.Cap), nil
}

// MostOverdue lists up to limit pending effects past due by more than by,
// the longest overdue first, on the due index.
func (l *Ledger) MostOverdue(ctx context.Context, q oncekit.Querier, by time.Duration, limit int) ([]Row, error) {
	return l.rows(ctx, q, "most overdue", `SELECT `+rowColumns+` FROM {schema}.side_effects e
		WHERE e.next_attempt_at IS NOT NULL AND e.next_attempt_at < now() - make_interval(secs => $1) AND e.state = 'pending'
		ORDER BY e.next_attempt_at LIMIT $2`, by.Seconds(), limit)
}

// UnknownAfter lists up to limit unknown effects with an ID above after,
// in ID order: they wait in the due index at 'infinity', which orders them
// by ID, so a page reads a page's worth however many wait. An index of
// their own would name state in its predicate and end the claims' HOT
// updates (decision 014).
func (l *Ledger) UnknownAfter(ctx context.Context, q oncekit.Querier, after int64, limit int) ([]Row, error) {
	return l.rows(ctx, q, "unknown", `SELECT `+rowColumns+` FROM {schema}.side_effects e
		WHERE e.next_attempt_at = 'infinity' AND e.state = 'unknown' AND e.id > $1
		ORDER BY e.id LIMIT $2`, after, limit)
}

// Related lists up to limit effects recorded for the source IDs sources
// (side_effects_source_kind_key) or with the idempotency key key
// (side_effects_idempotency_key), in ID order.
func (l *Ledger) Related(ctx context.Context, q oncekit.Querier, sources []string, key string, limit int) ([]Row, error) {
	return l.rows(ctx, q, "related", `SELECT `+rowColumns+` FROM {schema}.side_effects e WHERE e.source_id = ANY($1::text[])
		UNION
		SELECT `+rowColumns+` FROM {schema}.side_effects e WHERE e.idempotency_key = $2
		ORDER BY 1 LIMIT $3`, sources, key, limit)
}

// SourcesInTrace returns the source IDs of up to limit effects recorded in
// the W3C trace trace (32 hex digits), through the index
// side_effects_trace_id (migration 017).
func (l *Ledger) SourcesInTrace(ctx context.Context, q oncekit.Querier, trace string, limit int) ([]string, error) {
	rows, err := q.Query(ctx, pgsql.Render(`SELECT e.source_id FROM {schema}.side_effects e
		WHERE e.trace IS NOT NULL AND substr(e.trace->>'traceparent', 4, 32) = $1 LIMIT $2`, l.schema), trace, limit)
	if err != nil {
		return nil, fmt.Errorf("sideeffect: sources in trace: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// FiredPastLease lists up to limit fired effects whose lease expired more
// than grace ago (their dispatcher died mid-call and none took over), in
// ID order, and counts them all.
func (l *Ledger) FiredPastLease(ctx context.Context, q oncekit.Querier, grace time.Duration, limit int) ([]Row, int64, error) {
	return l.counted(ctx, q, "fired past lease", `e.next_attempt_at IS NOT NULL AND e.state = 'fired'
		AND e.lease_expires_at < now() - make_interval(secs => $2)`, limit, grace.Seconds())
}

// Unknown lists up to limit unknown effects (waiting for an operator) in
// ID order, and counts them all.
func (l *Ledger) Unknown(ctx context.Context, q oncekit.Querier, limit int) ([]Row, int64, error) {
	return l.counted(ctx, q, "unknown", `e.next_attempt_at = 'infinity' AND e.state = 'unknown'`, limit)
}

// PendingOverdue lists up to limit pending effects past due by more than
// by, in ID order, and counts them all.
func (l *Ledger) PendingOverdue(ctx context.Context, q oncekit.Querier, by time.Duration, limit int) ([]Row, int64, error) {
	return l.counted(ctx, q, "pending overdue", `e.next_attempt_at < now() - make_interval(secs => $2) AND e.state = 'pending'`,
		limit, by.Seconds())
}

// FailedWithin lists up to limit effects recorded within window that
// failed, in ID order, and counts them all. Failed rows left the due
// index; the BRIN index on created_at bounds the read to the window.
func (l *Ledger) FailedWithin(ctx context.Context, q oncekit.Querier, window time.Duration, limit int) ([]Row, int64, error) {
	return l.counted(ctx, q, "failed", `e.created_at >= now() - make_interval(secs => $2) AND e.state = 'failed'`,
		limit, window.Seconds())
}

// rows runs a statement over side_effects e selecting rowColumns.
func (l *Ledger) rows(ctx context.Context, q oncekit.Querier, what, sql string, args ...any) ([]Row, error) {
	rows, err := q.Query(ctx, pgsql.Render(sql, l.schema), args...)
	if err != nil {
		return nil, fmt.Errorf("sideeffect: %s: %w", what, err)
	}
	out, err := pgx.CollectRows(rows, scanRow)
	if err != nil {
		return nil, fmt.Errorf("sideeffect: %s: %w", what, err)
	}
	return out, nil
}

// counted lists the first limit effects e matching where (whose
// parameters are args, from $2) in ID order, and counts them all.
func (l *Ledger) counted(ctx context.Context, q oncekit.Querier, what, where string, limit int, args ...any) ([]Row, int64, error) {
	rows, err := q.Query(ctx, pgsql.Render(`SELECT `+rowColumns+`, count(*) OVER () FROM {schema}.side_effects e
		WHERE `+where+` ORDER BY e.id LIMIT $1`, l.schema), append([]any{limit}, args...)...)
	if err != nil {
		return nil, 0, fmt.Errorf("sideeffect: %s: %w", what, err)
	}
	var total int64
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Row, error) {
		var r Row
		var state string
		err := row.Scan(&r.ID, &r.SourceID, &r.Kind, &r.Payload, &r.Key, &state, &r.Attempts, &r.NextAttemptAt,
			&r.LeaseOwner, &r.LeaseExpiresAt, &r.ProviderRef, &r.LastError,
			&r.ResolvedBy, &r.ResolutionNote, &r.ResolvedAt,
			&r.CreatedAt, &r.FiredAt, &r.ConfirmedAt, &r.UpdatedAt, &total)
		r.State = State(state)
		return r, err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("sideeffect: %s: %w", what, err)
	}
	return out, total, nil
}
