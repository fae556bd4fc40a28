package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/pgsql"
)

// MaxPartitions is the largest partition count Repartition accepts. Each
// partition a relay holds costs it a goroutine and, while it is busy, a
// connection.
const MaxPartitions = 1024

// Reasons Repartition refuses a change. The error it returns wraps one.
var (
	// ErrInvalidPartitions: the count is below 1 or above MaxPartitions.
	ErrInvalidPartitions = errors.New("outbox: invalid partition count")
	// ErrSamePartitions: the outbox already has that count.
	ErrSamePartitions = errors.New("outbox: the outbox already has that partition count")
	// ErrRepartitionInProgress: the relays have not finished the previous
	// change (RepartitionState.Phase is not empty): rows of an earlier epoch
	// are still unpublished.
	ErrRepartitionInProgress = errors.New("outbox: a repartition is in progress")
)

// Phases of a repartition, as RepartitionState.Phase reports them.
const (
	// PhaseDrain: rows of the earlier epoch are being published; no row of
	// the current epoch goes out before they all have.
	PhaseDrain = "drain"
	// PhaseHeld: only held rows (parked or waiting for a retry) of the
	// earlier epoch are left; the rows of their keys wait behind them,
	// every other key flows.
	PhaseHeld = "held"
)

// RepartitionState is the outbox's partitioning (outbox_epoch).
type RepartitionState struct {
	// Epoch counts the changes of partition count.
	Epoch int
	// Partitions is the count writers use.
	Partitions int
	// Previous is the count before the last change (0 before any).
	Previous int
	// Phase is PhaseDrain or PhaseHeld while the relays finish the last
	// change, empty once they have.
	Phase string
	// ChangedAt is when the last change was made (or the migration ran).
	ChangedAt time.Time
}

// Repartition changes the outbox's partition count to n online: writers and
// relays keep running, and each key's messages keep their order.
//
// It takes the ACCESS EXCLUSIVE lock of outbox_epoch, which every Enqueue's
// INSERT reads under ACCESS SHARE until its transaction ends: it waits for
// the writers in flight to commit, while new writers wait for it (cancel
// ctx to give up). Rows written after it use the new count, in a new epoch;
// the relays publish no row of the new epoch until every row of the earlier
// one is out, then (PhaseHeld) hold only the keys that have a parked or
// retrying row of the earlier epoch behind it. The relays lease the
// partitions added, and retire those beyond a smaller count once retention
// has emptied them. Given a pgx.Tx, db makes a savepoint, and the lock is
// held until that transaction ends.
//
// It refuses a count below 1 or above MaxPartitions (ErrInvalidPartitions),
// the count in use (ErrSamePartitions), and a change while the previous one
// is in progress (ErrRepartitionInProgress).
func (o *Outbox) Repartition(ctx context.Context, db oncekit.Beginner, n int) error {
	if n < 1 || n > MaxPartitions {
		return fmt.Errorf("%w: %d (1 to %d)", ErrInvalidPartitions, n, MaxPartitions)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("outbox: repartition: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, pgsql.Render(lockEpochSQL, o.schema)); err != nil {
		return fmt.Errorf("outbox: repartition: lock outbox_epoch: %w", err)
	}
	cur, err := o.repartitionState(ctx, tx)
	if err != nil {
		return err
	}
	switch {
	case cur.Phase != "":
		return fmt.Errorf("%w: epoch %d, phase %s (from %d to %d partitions)",
			ErrRepartitionInProgress, cur.Epoch, cur.Phase, cur.Previous, cur.Partitions)
	case cur.Partitions == n:
		return fmt.Errorf("%w: %d", ErrSamePartitions, n)
	}
	if _, err := tx.Exec(ctx, pgsql.Render(switchEpochSQL, o.schema), n); err != nil {
		return fmt.Errorf("outbox: repartition: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("outbox: repartition: commit: %w", err)
	}
	return nil
}

// RepartitionState reads the outbox's partitioning through q.
func (o *Outbox) RepartitionState(ctx context.Context, q oncekit.Querier) (RepartitionState, error) {
	return o.repartitionState(ctx, q)
}

func (o *Outbox) repartitionState(ctx context.Context, q oncekit.Querier) (RepartitionState, error) {
	var s RepartitionState
	var prev *int32
	var phase *string
	if err := q.QueryRow(ctx, pgsql.Render(epochStateSQL, o.schema)).Scan(&s.Epoch, &s.Partitions, &prev, &phase, &s.ChangedAt); err != nil {
		return s, fmt.Errorf("outbox: read outbox_epoch: %w", err)
	}
	if prev != nil {
		s.Previous = int(*prev)
	}
	if phase != nil {
		s.Phase = *phase
	}
	return s, nil
}

const (
	lockEpochSQL  = `LOCK TABLE {schema}.outbox_epoch IN ACCESS EXCLUSIVE MODE`
	epochStateSQL = `SELECT epoch, partitions, previous, phase, changed_at FROM {schema}.outbox_epoch`
	// The new count in a new epoch, which the relays drain to; a row of
	// relay_partitions for every partition of it (those beyond stay until
	// the relays retire them).
	switchEpochSQL = `WITH parts AS (
			INSERT INTO {schema}.relay_partitions (partition)
			SELECT generate_series(0, $1::int - 1) ON CONFLICT DO NOTHING)
		UPDATE {schema}.outbox_epoch SET epoch = epoch + 1, previous = partitions, partitions = $1,
			phase = 'drain', changed_at = now(), drain_below = pg_snapshot_xmax(pg_current_snapshot())`
)
