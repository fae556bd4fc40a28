package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/pgsql"
)

// The reads operators' tools compose (oncekit status, the console, drift):
// the outbox package is the one place that says what its tables' rows
// mean. Each read takes the querier to run on, so that a caller's figures
// can come from one transaction, and reads through an index or under a
// limit.

// Unpublished is what the outbox has yet to publish, read the way the
// schema runs.
type Unpublished struct {
	// Rows is the backlog of the outbox table, parked rows aside: the
	// polling relay's. In logical mode it holds only rows written before
	// the switch (normally none): the events are WAL messages.
	Rows Backlog
	// Logical says that the schema runs in logical mode (Config.Logical,
	// or the slot set up: SlotStatus.SetUp): what is behind is Slot's lag,
	// not rows.
	Logical bool
	// Slot is the logical relay's replication slot; zero unless Logical.
	Slot SlotStatus
	// Partitions is Rows by partition, partitions without backlog left
	// out; only from UnpublishedByPartition.
	Partitions []PartitionBacklog
}

// OldestAge is the age of the oldest unpublished event: the oldest row's
// or, in logical mode, the slot's lag in time when it is larger and known
// (SlotStatus.LagSeconds).
func (u Unpublished) OldestAge() time.Duration {
	age := u.Rows.OldestAge
	if u.Logical && u.Slot.LagSeconds != nil {
		age = max(age, time.Duration(*u.Slot.LagSeconds*float64(time.Second)))
	}
	return age
}

// Behind says that something waits to be published: unpublished rows, or
// in logical mode a slot that is behind or lost (SlotStatus.Behind).
func (u Unpublished) Behind() bool {
	return u.Rows.Pending > 0 || (u.Logical && u.Slot.Behind())
}

// setUpSQL is SlotStatus.SetUp for the slot $1: its publication, its
// record in logical_slots or the slot itself exists.
const setUpSQL = `(EXISTS (SELECT FROM pg_publication WHERE pubname = $1)
	OR EXISTS (SELECT FROM {schema}.logical_slots WHERE slot = $1)
	OR EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1 AND slot_type = 'logical'))`

// backlogModeSQL is backlogSQL and whether logical mode is set up, in one
// statement: a schema in table mode pays nothing more for its mode.
var backlogModeSQL = unpublishedSQL + `
	SELECT coalesce(sum(n), 0)::bigint, coalesce(extract(epoch FROM now() - min(oldest)), 0)::float8, ` + setUpSQL + ` FROM u`

// Unpublished reads what the outbox has yet to publish: the table's
// backlog (Backlog) and, when the schema runs in logical mode, the slot
// (SlotStatus, which needs SELECT on logical_slots). Unlike Backlog it
// knows the mode: a schema in logical mode has no row backlog, and its
// events are behind by the slot's lag.
func (o *Outbox) Unpublished(ctx context.Context, q oncekit.Querier) (Unpublished, error) {
	var u Unpublished
	var age float64
	// JIT off: see Backlog.
	if err := pgsql.QueryRowNoJIT(ctx, q, pgsql.Render(backlogModeSQL, o.schema), []any{o.slot}, &u.Rows.Pending, &age, &u.Logical); err != nil {
		return Unpublished{}, fmt.Errorf("outbox: unpublished: %w", err)
	}
	u.Rows.OldestAge = seconds(age)
	if !u.Logical && !o.logical {
		return u, nil
	}
	s, err := o.SlotStatus(ctx, q)
	if err != nil {
		return Unpublished{}, err
	}
	u.Logical, u.Slot = true, s
	return u, nil
}

// UnpublishedByPartition is Unpublished with the table's backlog read by
// partition (Partitions), Rows their sum. Over a large outbox, run it on a
// connection with jit off (see Backlog).
func (o *Outbox) UnpublishedByPartition(ctx context.Context, q oncekit.Querier) (Unpublished, error) {
	u, err := o.mode(ctx, q)
	if err != nil {
		return Unpublished{}, err
	}
	if u.Partitions, err = o.BacklogByPartition(ctx, q); err != nil {
		return Unpublished{}, err
	}
	for _, p := range u.Partitions {
		u.Rows.Pending += p.Pending
		u.Rows.OldestAge = max(u.Rows.OldestAge, p.OldestAge)
	}
	return u, nil
}

// mode reads whether the schema runs in logical mode, and its slot.
func (o *Outbox) mode(ctx context.Context, q oncekit.Querier) (Unpublished, error) {
	s, err := o.SlotStatus(ctx, q)
	if err != nil {
		return Unpublished{}, err
	}
	u := Unpublished{Logical: o.logical || s.SetUp}
	if u.Logical {
		u.Slot = s
	}
	return u, nil
}

// PartitionLease is a partition's row in relay_partitions: its owner and
// lease.
type PartitionLease struct {
	Partition int
	// Owner is the relay holding the lease, "" when free.
	Owner string
	// LeaseLeft is the time left on the lease, negative since it expired;
	// zero for a partition never leased or released.
	LeaseLeft time.Duration
}

const partitionLeasesSQL = `SELECT partition, coalesce(owner, ''),
		CASE WHEN isfinite(expires_at) THEN extract(epoch FROM expires_at - now())::float8 ELSE 0 END
		FROM {schema}.relay_partitions ORDER BY partition`

// PartitionLeases lists every partition (one row each: a small table) with
// its owner and lease, in partition order.
func (o *Outbox) PartitionLeases(ctx context.Context, q oncekit.Querier) ([]PartitionLease, error) {
	rows, err := q.Query(ctx, pgsql.Render(partitionLeasesSQL, o.schema))
	if err != nil {
		return nil, fmt.Errorf("outbox: partition leases: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (PartitionLease, error) {
		var p PartitionLease
		var left float64
		err := r.Scan(&p.Partition, &p.Owner, &left)
		p.LeaseLeft = seconds(left)
		return p, err
	})
}

// RelayNode is a relay process and its last heartbeat.
type RelayNode struct {
	ID           string
	HeartbeatAge time.Duration
}

const relayNodesSQL = `SELECT id, extract(epoch FROM now() - heartbeat_at)::float8 FROM {schema}.relay_nodes
		ORDER BY id LIMIT $1`

// RelayNodes lists up to limit relay processes by ID with the age of their
// last heartbeat (dead ones stay until a live relay forgets them).
func (o *Outbox) RelayNodes(ctx context.Context, q oncekit.Querier, limit int) ([]RelayNode, error) {
	rows, err := q.Query(ctx, pgsql.Render(relayNodesSQL, o.schema), limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: relay nodes: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (RelayNode, error) {
		var n RelayNode
		var age float64
		err := r.Scan(&n.ID, &age)
		n.HeartbeatAge = seconds(age)
		return n, err
	})
}

// Parked rows are in the partial index outbox_blocked: its predicate is
// held(o), spelt the same way.
var (
	parkedCountSQL = `SELECT count(*) FROM {schema}.outbox o
		WHERE ` + held("o") + ` AND o.parked_at IS NOT NULL`
	parkedKeysSQL = `SELECT o.ordering_key, count(*), extract(epoch FROM now() - min(o.parked_at))::float8
		FROM {schema}.outbox o WHERE ` + held("o") + ` AND o.parked_at IS NOT NULL
		GROUP BY o.ordering_key ORDER BY min(o.parked_at), o.ordering_key LIMIT $1`
	parkedSQL = `SELECT o.id, o.ordering_key, o.subject, o.attempts, count(*) OVER ()
		FROM {schema}.outbox o WHERE ` + held("o") + ` AND o.parked_at IS NOT NULL
		ORDER BY o.id LIMIT $1`
)

// ParkedCount counts the parked messages.
func (o *Outbox) ParkedCount(ctx context.Context, q oncekit.Querier) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, pgsql.Render(parkedCountSQL, o.schema)).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: parked count: %w", err)
	}
	return n, nil
}

// ParkedKey is an ordering key held by parked messages.
type ParkedKey struct {
	Key string
	// Messages counts the key's parked messages.
	Messages int64
	// ParkedAge is the time since its first was parked.
	ParkedAge time.Duration
}

// ParkedKeys lists up to limit keys held by parked messages, the longest
// parked first.
func (o *Outbox) ParkedKeys(ctx context.Context, q oncekit.Querier, limit int) ([]ParkedKey, error) {
	rows, err := q.Query(ctx, pgsql.Render(parkedKeysSQL, o.schema), limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: parked keys: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ParkedKey, error) {
		var k ParkedKey
		var age float64
		err := r.Scan(&k.Key, &k.Messages, &age)
		k.ParkedAge = seconds(age)
		return k, err
	})
}

// ParkedMessage is a parked message, as Parked lists it.
type ParkedMessage struct {
	ID       uuid.UUID
	Key      string
	Subject  string
	Attempts int
}

// Parked lists up to limit parked messages in ID order, and counts them
// all.
func (o *Outbox) Parked(ctx context.Context, q oncekit.Querier, limit int) ([]ParkedMessage, int64, error) {
	rows, err := q.Query(ctx, pgsql.Render(parkedSQL, o.schema), limit)
	if err != nil {
		return nil, 0, fmt.Errorf("outbox: parked: %w", err)
	}
	var total int64
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ParkedMessage, error) {
		var m ParkedMessage
		err := r.Scan(&m.ID, &m.Key, &m.Subject, &m.Attempts, &total)
		return m, err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("outbox: parked: %w", err)
	}
	return out, total, nil
}

// Event is an outbox row found by its ID, as Events reports it.
type Event struct {
	Seq       int64
	ID        uuid.UUID
	Partition int
	Key       string
	Subject   string
	Attempts  int
	CreatedAt time.Time
	Parked    bool
	LastError string
	// Published is true once its partition's cursor passed it and it is
	// not held (waiting for a retry, or parked).
	Published bool
}

// eventsSQL reads events by ID (outbox_id_key).
var eventsSQL = `SELECT o.seq, o.id, o.partition, o.ordering_key, o.subject, o.attempts, o.created_at,
	o.parked_at IS NOT NULL, coalesce(o.last_error, ''),
	(o.txid, o.seq) <= (coalesce(p.cursor_txid, '2'), coalesce(p.cursor_seq, 0)) AND NOT ` + held("o") + `
FROM {schema}.outbox o LEFT JOIN {schema}.relay_partitions p ON p.partition = o.partition
WHERE o.id = ANY($1::uuid[]) ORDER BY o.seq LIMIT $2`

// Events reads the rows of the messages ids, up to limit, in the order
// they were enqueued. In logical mode the events are WAL messages, not
// rows: only rows written before the switch are found.
func (o *Outbox) Events(ctx context.Context, q oncekit.Querier, ids []uuid.UUID, limit int) ([]Event, error) {
	rows, err := q.Query(ctx, pgsql.Render(eventsSQL, o.schema), pgsql.UUIDs(ids), limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: events: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Event])
}

// seconds is a figure PostgreSQL gave in seconds as a Duration.
func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
