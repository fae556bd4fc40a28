package report

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/outbox"
)

// Status is everything `oncekit status` and the console's overview show.
type Status struct {
	Schema    string     `json:"schema"`
	At        time.Time  `json:"at"`
	Outbox    Outbox     `json:"outbox"`
	Consumers []Consumer `json:"consumers"`
	Effects   []Effects  `json:"effects"`
	// EffectsCapped says that a count of effects stopped at LiveCap: due
	// ones, unknown ones, or the newest recorded (all within the recent
	// window): each figure is then at least what it says.
	EffectsCapped bool        `json:"effects_capped,omitempty"`
	Idempotency   Idempotency `json:"idempotency"`
}

// Outbox is the relay's side: backlog, parked rows and keys, partition
// ranges and their owners, relay nodes.
type Outbox struct {
	Unpublished
	Parked     int64       `json:"parked"`
	Ranges     []Range     `json:"partition_ranges"`
	Nodes      []Node      `json:"relay_nodes"`
	ParkedKeys []ParkedKey `json:"parked_keys"`
	// Slot is the logical relay's replication slot, when the schema runs
	// in logical mode (outbox.Config.Logical): its events live in the WAL,
	// not in the table, and what is behind is the slot's lag.
	Slot *outbox.SlotStatus `json:"slot,omitempty"`
}

// Unpublished is the unpublished rows of the outbox or of some of its
// partitions: how many, and the age of the oldest.
type Unpublished struct {
	Backlog          int64   `json:"backlog"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
}

// add counts b's rows in s.
func (s *Unpublished) add(b Unpublished) {
	s.Backlog += b.Backlog
	s.OldestAgeSeconds = max(s.OldestAgeSeconds, b.OldestAgeSeconds)
}

// Range is a run of consecutive partitions with the same owner and
// lease state.
type Range struct {
	First        int     `json:"first"`
	Last         int     `json:"last"`
	Owner        string  `json:"owner"`
	LeaseSeconds float64 `json:"lease_seconds"` // left (>0) or since expiry (<0)
	Unpublished
}

// Node is a relay process and its last heartbeat.
type Node struct {
	ID                  string  `json:"id"`
	HeartbeatAgeSeconds float64 `json:"heartbeat_age_seconds"`
}

// ParkedKey is an ordering key held by a parked message.
type ParkedKey struct {
	Key              string  `json:"key"`
	Messages         int64   `json:"messages"`
	ParkedAgeSeconds float64 `json:"parked_age_seconds"`
}

// Consumer is an inbox consumer: its recent claims and dead letters.
type Consumer struct {
	Name                 string   `json:"name"`
	ClaimsLastHour       int64    `json:"claims_last_hour"`
	Processed            *float64 `json:"processed_total"`
	Duplicates           *float64 `json:"duplicates_total"`
	DeadLetters          int64    `json:"dead_letters"`
	OldestDeadAgeSeconds float64  `json:"oldest_dead_letter_age_seconds"`
}

// Effects counts one kind's side effects by state.
type Effects struct {
	Kind      string `json:"kind"`
	Pending   int64  `json:"pending"`
	Overdue   int64  `json:"pending_overdue"`
	Fired     int64  `json:"fired"`
	PastLease int64  `json:"fired_past_lease"`
	Unknown   int64  `json:"unknown"`
	Confirmed int64  `json:"confirmed_recent"`
	Failed    int64  `json:"failed_recent"`
}

// Idempotency counts the edge's records by state.
type Idempotency struct {
	InProgress          int64 `json:"in_progress"`
	InProgressPastLease int64 `json:"in_progress_past_lease"`
	// Completed counts completed records up to CompletedCap: a count of
	// every one would read the whole table's index, and grow with it.
	Completed       int64 `json:"completed"`
	CompletedCapped bool  `json:"completed_capped,omitempty"`
	Unknown         int64 `json:"unknown"`
}

// Limit bounds the rows of each list.
const Limit = 50

// Read reads every figure in tx (read-only and repeatable-read, so that
// they agree), whose now() is the report's time: pending effects overdue
// past overdue count as such, and settled effects are counted over recent.
// Each figure reads through an index or under Limit. schema is checked by
// oncekit.ValidateSchema ("" means oncekit.DefaultSchema). slot names the
// logical relay's replication slot (outbox.Config.Slot; "" for its
// default): the outbox reads it, and the report shows it when logical mode
// is set up.
func Read(ctx context.Context, tx pgx.Tx, schema, slot string, overdue, recent time.Duration) (Status, error) {
	schema, err := oncekit.ValidateSchema(schema)
	if err != nil {
		return Status{}, fmt.Errorf("report: %w", err)
	}
	rep := Status{Schema: schema, Consumers: []Consumer{}, Effects: []Effects{}}
	q := func(sql string) string { return pgsql.Render(sql, schema) }
	// JIT off for the rest of tx: the outbox's backlog after the cursors
	// defies estimates, and over a large outbox its plan is priced past
	// jit_above_cost; compiling it cost 600 ms at 10M rows, for a query
	// that runs in one. And generic plans until the last statement, which
	// sets back the mode tx had: every statement here reads through an index
	// whatever its parameters (TestReportReadsThroughIndexes holds them to
	// it with generic plans), and on large tables PostgreSQL otherwise kept
	// planning the effects' counts anew on every run (0.3 ms, twice their
	// execution), its generic plan priced above its custom ones.
	var planMode string
	if err := tx.QueryRow(ctx, `SELECT now(), set_config('jit', 'off', true), m.mode, set_config('plan_cache_mode', 'force_generic_plan', true)
		FROM (SELECT current_setting('plan_cache_mode') AS mode OFFSET 0) m`).Scan(&rep.At, nil, &planMode, nil); err != nil {
		return rep, err
	}
	ob, err := outbox.New(&outbox.Config{Schema: schema, Slot: slot})
	if err != nil {
		return rep, err
	}
	if s, err := ob.SlotStatus(ctx, tx); err != nil {
		return rep, err
	} else if s.SetUp {
		rep.Outbox.Slot = &s
	}
	backlog, err := ob.BacklogByPartition(ctx, tx)
	if err != nil {
		return rep, err
	}
	byPart := map[int]Unpublished{}
	for _, b := range backlog {
		pb := Unpublished{Backlog: b.Pending, OldestAgeSeconds: b.OldestAge.Seconds()}
		byPart[b.Partition] = pb
		rep.Outbox.add(pb)
	}
	// relay_partitions has one row per partition: small.
	rows, err := tx.Query(ctx, q(`SELECT partition, coalesce(owner, ''),
		CASE WHEN isfinite(expires_at) THEN extract(epoch FROM expires_at - now())::float8 ELSE 0 END
		FROM {schema}.relay_partitions ORDER BY partition`))
	if err != nil {
		return rep, err
	}
	var parts []Range
	parts, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Range, error) {
		var s Range
		err := r.Scan(&s.First, &s.Owner, &s.LeaseSeconds)
		s.Last = s.First
		if s.Owner == "" {
			s.LeaseSeconds = 0
		}
		s.Unpublished = byPart[s.First]
		return s, err
	})
	if err != nil {
		return rep, err
	}
	rep.Outbox.Ranges = groupRanges(parts)
	rows, err = tx.Query(ctx, q(`SELECT id, extract(epoch FROM now() - heartbeat_at)::float8 FROM {schema}.relay_nodes
		ORDER BY id LIMIT $1`), Limit)
	if err != nil {
		return rep, err
	}
	if rep.Outbox.Nodes, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Node]); err != nil {
		return rep, err
	}
	// Parked rows are in the partial index outbox_blocked.
	if err := tx.QueryRow(ctx, q(`SELECT count(*) FROM {schema}.outbox o
		WHERE (o.parked_at IS NOT NULL OR o.next_attempt_at IS NOT NULL) AND o.parked_at IS NOT NULL`)).Scan(&rep.Outbox.Parked); err != nil {
		return rep, err
	}
	rows, err = tx.Query(ctx, q(`SELECT o.ordering_key, count(*), extract(epoch FROM now() - min(o.parked_at))::float8
		FROM {schema}.outbox o WHERE (o.parked_at IS NOT NULL OR o.next_attempt_at IS NOT NULL) AND o.parked_at IS NOT NULL
		GROUP BY o.ordering_key ORDER BY min(o.parked_at), o.ordering_key LIMIT $1`), Limit)
	if err != nil {
		return rep, err
	}
	if rep.Outbox.ParkedKeys, err = pgx.CollectRows(rows, pgx.RowToStructByPos[ParkedKey]); err != nil {
		return rep, err
	}
	if rep.Consumers, err = readConsumers(ctx, tx, q); err != nil {
		return rep, err
	}
	if rep.Effects, rep.EffectsCapped, err = readEffects(ctx, tx, q, overdue, recent); err != nil {
		return rep, err
	}
	// Each count reads a partial index: in-progress claims under a lease,
	// completed records (idempotency_keys_expired, the newest first: under
	// a bare limit the planner reads the table from its first page, which a
	// large table's sequential scan does not keep in shared_buffers), unknown
	// ones (idempotency_keys_unsettled).
	err = tx.QueryRow(ctx, q(`SELECT
		(SELECT count(*) FROM {schema}.idempotency_keys WHERE state = 'in_progress' AND locked_until IS NOT NULL),
		(SELECT count(*) FROM {schema}.idempotency_keys WHERE state = 'in_progress' AND locked_until IS NOT NULL AND locked_until < now()),
		(SELECT count(*) FROM (SELECT FROM {schema}.idempotency_keys WHERE state = 'completed' AND expires_at > '-infinity'
			ORDER BY expires_at DESC LIMIT $1) c),
		(SELECT count(*) FROM {schema}.idempotency_keys WHERE state = 'unknown'),
		set_config('plan_cache_mode', $2, true)`), CompletedCap+1, planMode).
		Scan(&rep.Idempotency.InProgress, &rep.Idempotency.InProgressPastLease, &rep.Idempotency.Completed, &rep.Idempotency.Unknown, nil)
	if rep.Idempotency.Completed > CompletedCap {
		rep.Idempotency.Completed, rep.Idempotency.CompletedCapped = CompletedCap, true
	}
	return rep, err
}

// CompletedCap bounds the count of completed edge records.
const CompletedCap = 1000

// groupRanges merges consecutive partitions with the same owner and lease
// state (held, expired or free).
func groupRanges(parts []Range) []Range {
	out := []Range{}
	state := func(s Range) string {
		switch {
		case s.Owner == "":
			return "free"
		case s.LeaseSeconds <= 0:
			return "expired"
		}
		return "held"
	}
	for _, p := range parts {
		if n := len(out); n > 0 && out[n-1].Last+1 == p.First && out[n-1].Owner == p.Owner && state(out[n-1]) == state(p) {
			r := &out[n-1]
			r.Last = p.First
			r.LeaseSeconds = min(r.LeaseSeconds, p.LeaseSeconds)
			r.add(p.Unpublished)
			continue
		}
		out = append(out, p)
	}
	return out
}

// readConsumers lists the consumers with claims in the last hour (a range
// of the BRIN index on processed_at) or with pending dead letters.
func readConsumers(ctx context.Context, tx pgx.Tx, q func(string) string) ([]Consumer, error) {
	rows, err := tx.Query(ctx, q(`WITH claims AS (
			SELECT consumer, count(*) AS n FROM {schema}.processed_messages
			WHERE processed_at >= now() - interval '1 hour' GROUP BY consumer),
		dead AS (
			SELECT consumer, count(*) AS n, extract(epoch FROM now() - min(created_at))::float8 AS oldest
			FROM {schema}.dead_letters WHERE replayed_at IS NULL GROUP BY consumer)
		SELECT coalesce(c.consumer, d.consumer), coalesce(c.n, 0), coalesce(d.n, 0), coalesce(d.oldest, 0)
		FROM claims c FULL JOIN dead d ON d.consumer = c.consumer
		ORDER BY 1 LIMIT $1`), Limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Consumer, error) {
		var c Consumer
		err := r.Scan(&c.Name, &c.ClaimsLastHour, &c.DeadLetters, &c.OldestDeadAgeSeconds)
		return c, err
	})
}

// readEffects counts effects by kind and state: the live ones (pending and
// fired, then unknown: LiveCap of each at most) through the due index, and
// the settled ones recorded within recent among the newest LiveCap effects,
// through the primary key (IDs grow with the time effects are recorded: a
// walk back from the newest stops at the first recorded before recent). It
// reports whether a count stopped at LiveCap.
//
// The BRIN index on created_at would find the recent effects too, but
// reading it costs a summary per 128 pages of the whole table: 0.55 ms at
// 10M effects, where the walk costs a few index pages (decision 025).
func readEffects(ctx context.Context, tx pgx.Tx, q func(string) string, overdue, recent time.Duration) ([]Effects, bool, error) {
	rows, err := tx.Query(ctx, q(`WITH live AS (
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
		FROM by_kind l FULL JOIN settled s ON s.kind = l.kind CROSS JOIN newest n ORDER BY 1 LIMIT $3`),
		overdue.Seconds(), recent.Seconds(), Limit, LiveCap)
	if err != nil {
		return nil, false, err
	}
	var capped bool
	effects, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Effects, error) {
		var e Effects
		err := r.Scan(&e.Kind, &e.Pending, &e.Overdue, &e.Fired, &e.PastLease, &e.Unknown, &e.Confirmed, &e.Failed, &capped)
		return e, err
	})
	var due, unknown int64
	for _, e := range effects {
		due += e.Pending + e.Fired
		unknown += e.Unknown
	}
	return effects, capped || due >= LiveCap || unknown >= LiveCap, err
}

// LiveCap bounds the effects the report counts: that many due (pending and
// fired, the earliest due first), that many unknown, and the settled ones
// among that many newest. A count of every live effect would read each
// (1.4 µs apiece at 10M rows of history), so a provider's outage that
// leaves a million effects pending would slow the report to seconds when an
// operator needs it.
const LiveCap = 10_000

// BytesIEC formats n bytes in its largest binary unit, one decimal (status
// and the console show WAL sizes so).
func BytesIEC(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, u := float64(n)/unit, 0
	for ; v >= unit && u < 4; u++ {
		v /= unit
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTP"[u])
}
