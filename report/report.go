package report

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/sideeffect"
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
	// JIT off for the rest of tx: the outbox's backlog after the cursors
	// defies estimates, and over a large outbox its plan is priced past
	// jit_above_cost; compiling it cost 600 ms at 10M rows, for a query
	// that runs in one. And generic plans until the reads are done, when the
	// mode tx had is set back: every statement here reads through an index
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
	store, err := inbox.NewStore(schema)
	if err != nil {
		return rep, err
	}
	ledger, err := sideeffect.New(&sideeffect.Config{Schema: schema})
	if err != nil {
		return rep, err
	}
	records, err := idempotency.NewRecords(schema)
	if err != nil {
		return rep, err
	}
	if rep.Outbox, err = readOutbox(ctx, tx, ob); err != nil {
		return rep, err
	}
	activity, err := store.Activity(ctx, tx, Limit)
	if err != nil {
		return rep, err
	}
	for _, a := range activity {
		rep.Consumers = append(rep.Consumers, Consumer{Name: a.Consumer, ClaimsLastHour: a.ClaimsLastHour,
			DeadLetters: a.DeadLetters, OldestDeadAgeSeconds: a.OldestDeadAge.Seconds()})
	}
	counts, capped, err := ledger.CountByKind(ctx, tx, sideeffect.CountOptions{Overdue: overdue, Recent: recent, Kinds: Limit, Cap: LiveCap})
	if err != nil {
		return rep, err
	}
	for _, k := range counts {
		rep.Effects = append(rep.Effects, Effects(k))
	}
	rep.EffectsCapped = capped
	c, err := records.Count(ctx, tx, CompletedCap)
	if err != nil {
		return rep, err
	}
	rep.Idempotency = Idempotency(c)
	_, err = tx.Exec(ctx, `SELECT set_config('plan_cache_mode', $1, true)`, planMode)
	return rep, err
}

// readOutbox reads the outbox's side: what is unpublished (the slot, in
// logical mode), by partition with the partitions' owners, the relay
// nodes and what is parked.
func readOutbox(ctx context.Context, tx pgx.Tx, ob *outbox.Outbox) (Outbox, error) {
	o := Outbox{Nodes: []Node{}, ParkedKeys: []ParkedKey{}}
	u, err := ob.UnpublishedByPartition(ctx, tx)
	if err != nil {
		return o, err
	}
	if u.Logical {
		o.Slot = &u.Slot
	}
	byPart := map[int]Unpublished{}
	for _, b := range u.Partitions {
		pb := Unpublished{Backlog: b.Pending, OldestAgeSeconds: b.OldestAge.Seconds()}
		byPart[b.Partition] = pb
		o.add(pb)
	}
	leases, err := ob.PartitionLeases(ctx, tx)
	if err != nil {
		return o, err
	}
	parts := make([]Range, 0, len(leases))
	for _, l := range leases {
		r := Range{First: l.Partition, Last: l.Partition, Owner: l.Owner, LeaseSeconds: l.LeaseLeft.Seconds(), Unpublished: byPart[l.Partition]}
		if r.Owner == "" {
			r.LeaseSeconds = 0
		}
		parts = append(parts, r)
	}
	o.Ranges = groupRanges(parts)
	nodes, err := ob.RelayNodes(ctx, tx, Limit)
	if err != nil {
		return o, err
	}
	for _, n := range nodes {
		o.Nodes = append(o.Nodes, Node{ID: n.ID, HeartbeatAgeSeconds: n.HeartbeatAge.Seconds()})
	}
	if o.Parked, err = ob.ParkedCount(ctx, tx); err != nil {
		return o, err
	}
	keys, err := ob.ParkedKeys(ctx, tx, Limit)
	if err != nil {
		return o, err
	}
	for _, k := range keys {
		o.ParkedKeys = append(o.ParkedKeys, ParkedKey{Key: k.Key, Messages: k.Messages, ParkedAgeSeconds: k.ParkedAge.Seconds()})
	}
	return o, nil
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
