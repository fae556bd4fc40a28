package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/pgsql"
)

// The state of a row follows from its partition's cursor in
// relay_partitions (migration 005): a row is published when it is at or
// before the cursor, (txid, seq) <= (cursor_txid, cursor_seq), and not held.
// Held rows wait for a retry, are parked, or follow a blocked row of their
// key. Everything else, after the cursor, is pending. A partition without a
// relay_partitions row has never been read: its cursor is before everything.

// held is true for a row that waits for a retry, is parked, or follows a
// blocked row of its key. It is the predicate of the partial index
// outbox_blocked, spelt the same way so that the planner uses the index.
func held(alias string) string {
	return "(" + alias + ".parked_at IS NOT NULL OR " + alias + ".next_attempt_at IS NOT NULL)"
}

// cursors lists every partition that has rows (up to the highest one, found
// at the end of the index outbox_pending) with its cursor as (part, ct, cs).
// The partitions come from an array: the planner takes a generate_series
// whose bound is a subquery for 1,000 rows, which prices the per-partition
// scans far higher than they are.
const cursors = `SELECT g.part, coalesce(p.cursor_txid, '2') AS ct, coalesce(p.cursor_seq, 0) AS cs
	FROM unnest(ARRAY(SELECT generate_series(0, (SELECT max(partition) FROM {schema}.outbox)))) AS g(part)
	LEFT JOIN {schema}.relay_partitions p ON p.partition = g.part`

// unpublishedSQL is, per partition, the count of unpublished, unparked
// rows and the oldest one's created_at (u: part, n, oldest): the rows after
// each partition's cursor (an index range scan per partition, forced by the
// aggregate in LATERAL, so the history behind the cursor is never read), and
// the held rows behind it (from the small index outbox_blocked).
var unpublishedSQL = `WITH c AS (` + cursors + `),
	u AS (
		SELECT c.part, a.n, a.oldest FROM c, LATERAL (
			SELECT count(*) AS n, min(o.created_at) AS oldest FROM {schema}.outbox o
			WHERE o.partition = c.part AND (o.txid, o.seq) > (c.ct, c.cs) AND o.parked_at IS NULL) a
		UNION ALL
		SELECT o.partition, count(*), min(o.created_at) FROM {schema}.outbox o JOIN c ON c.part = o.partition
		WHERE ` + held("o") + ` AND o.parked_at IS NULL AND (o.txid, o.seq) <= (c.ct, c.cs)
		GROUP BY o.partition)`

// backlogSQL counts the unpublished, unparked rows and gives the age in
// seconds of the oldest (0 when there is none).
var backlogSQL = unpublishedSQL + `
	SELECT coalesce(sum(n), 0)::bigint, coalesce(extract(epoch FROM now() - min(oldest)), 0)::float8 FROM u`

// backlogByPartitionSQL is backlogSQL per partition, partitions without
// backlog left out.
var backlogByPartitionSQL = unpublishedSQL + `
	SELECT part, sum(n)::bigint, coalesce(extract(epoch FROM now() - min(oldest)), 0)::float8 FROM u
	GROUP BY part HAVING sum(n) > 0 ORDER BY part`

// Backlog is what the outbox holds unpublished, parked messages aside.
type Backlog struct {
	// Pending counts the messages not yet published (waiting for a retry
	// included).
	Pending int64
	// OldestAge is the age of the oldest of them, from its Enqueue; zero when
	// there is none.
	OldestAge time.Duration
}

// Backlog reports the unpublished messages, parked ones aside.
func (o *Outbox) Backlog(ctx context.Context, q oncekit.Querier) (Backlog, error) {
	var b Backlog
	var age float64
	// Rows after a cursor defy estimates: over a large outbox the plan is
	// priced past jit_above_cost, and compiling it would cost hundreds of
	// milliseconds for a query that runs in one.
	if err := pgsql.QueryRowNoJIT(ctx, q, o.backlogSQL, nil, &b.Pending, &age); err != nil {
		return Backlog{}, fmt.Errorf("outbox: backlog: %w", err)
	}
	b.OldestAge = time.Duration(age * float64(time.Second))
	return b, nil
}

// PartitionBacklog is one partition's share of the Backlog.
type PartitionBacklog struct {
	Partition int
	Backlog
}

// BacklogByPartition reports the unpublished messages of each partition that
// has any, parked ones aside, in partition order. Over a large outbox, run
// it on a connection with jit off (see Backlog).
func (o *Outbox) BacklogByPartition(ctx context.Context, q oncekit.Querier) ([]PartitionBacklog, error) {
	rows, err := q.Query(ctx, o.backlogByPartitionSQL)
	if err != nil {
		return nil, fmt.Errorf("outbox: backlog by partition: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (PartitionBacklog, error) {
		var p PartitionBacklog
		var age float64
		err := r.Scan(&p.Partition, &p.Pending, &age)
		p.OldestAge = time.Duration(age * float64(time.Second))
		return p, err
	})
}
