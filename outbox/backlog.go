package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/pgsql"
)

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
	if err := pgsql.QueryRowNoJIT(ctx, q, o.sql.backlog, nil, &b.Pending, &age); err != nil {
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
	rows, err := q.Query(ctx, o.sql.backlogByPartition)
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
