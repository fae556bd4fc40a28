package outbox

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/wait"
)

// The relay's side of a repartition (decision 037). A worker whose batch
// reaches a row of the epoch after a repartition stops before it and is
// marked barred; the barrier loop then tries, every barrierEvery, to lift
// the barrier (liftSQL) and pokes the barred workers once it is lifted, by
// this relay or another. The lease loop reads the partition count on every
// round, so that the relay leases the partitions a repartition added, and
// retires the partitions beyond a count that shrank once they are empty.

// barrierEvery is how often a relay with barred workers looks whether the
// rows of the earlier epoch are out.
const barrierEvery = 100 * time.Millisecond

// noBarrier turns the barrier off, for a test that shows what the relays
// did without it.
var noBarrier atomic.Bool

// barrier is the relay's set of barred workers.
type barrier struct {
	mu     sync.Mutex
	barred map[*worker]bool
	kick   chan struct{}
}

func newBarrier() barrier {
	return barrier{barred: map[*worker]bool{}, kick: make(chan struct{}, 1)}
}

// barred records that w's batch stopped at the barrier.
func (r *Relay) barred(w *worker) {
	r.bar.mu.Lock()
	r.bar.barred[w] = true
	r.bar.mu.Unlock()
	select {
	case r.bar.kick <- struct{}{}:
	default:
	}
}

// barrierLoop lifts the barrier when it can and pokes the barred workers
// once it is lifted. It returns when ctx ends.
func (r *Relay) barrierLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.bar.kick:
		}
		for {
			phase, err := r.liftBarrier(ctx)
			if err != nil && ctx.Err() == nil {
				r.log.Warn("looking at the repartition's barrier failed", "err", err)
			}
			if err == nil && phase != "drain" {
				r.bar.mu.Lock()
				ws := r.bar.barred
				r.bar.barred = map[*worker]bool{}
				r.bar.mu.Unlock()
				for w := range ws {
					w.poke()
				}
				break
			}
			if !wait.Sleep(ctx, barrierEvery) {
				return
			}
		}
	}
}

// liftBarrier moves a repartition on when it can ('drain' to 'held' or
// done, 'held' to done) and returns the phase it is in then ("": done).
func (r *Relay) liftBarrier(ctx context.Context) (string, error) {
	var phase *string
	if err := r.pool.QueryRow(ctx, r.sql.lift).Scan(&phase); err != nil {
		return "", fmt.Errorf("outbox: lift the repartition's barrier: %w", err)
	}
	if phase == nil {
		return "", nil
	}
	return *phase, nil
}

// epochRound reads the partition count (the rows of relay_partitions) for
// the lease loop, moves a repartition on, and retires the partitions this
// relay holds that a shrinking left empty.
func (r *Relay) epochRound(ctx context.Context) {
	var count, writers int32
	var phase *string
	if err := r.pool.QueryRow(ctx, r.sql.epochState).Scan(&count, &writers, &phase); err != nil {
		if ctx.Err() == nil {
			r.log.Warn("reading the partition count failed", "err", err)
		}
		return
	}
	if count > 0 && count != r.parts.Load() {
		r.log.Info("partition count changed", "partitions", count, "writers", writers)
		r.parts.Store(count)
	}
	if phase != nil {
		if _, err := r.liftBarrier(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("looking at the repartition's barrier failed", "err", err)
		}
		return
	}
	if count <= writers {
		return
	}
	held := r.heldPartitions()
	rows, err := r.pool.Query(ctx, r.sql.retire, r.cfg.ID, held)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("retiring partitions failed", "err", err)
		}
		return
	}
	var gone []int
	for rows.Next() {
		var p int
		if err := rows.Scan(&p); err != nil {
			break
		}
		gone = append(gone, p)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		r.log.Warn("retiring partitions failed", "err", err)
		return
	}
	r.mu.Lock()
	for _, p := range gone {
		if w := r.workers[p]; w != nil {
			w.signalStop()
			delete(r.workers, p)
		}
		r.log.Info("partition retired", "partition", p)
	}
	r.mu.Unlock()
}

// epochSQL holds the relay's statements of a repartition.
type epochSQL struct {
	lift, epochState, retire, relayPartitions string
}

func renderEpochSQL(schema string) epochSQL {
	q := epochSQL{
		// Lift the barrier: 'drain' ends when no row of an earlier epoch
		// waits after its partition's cursor unheld (the writers of the
		// earlier epoch all committed before the repartition did, so none
		// can appear later); it becomes 'held' while held rows of an
		// earlier epoch with a key are left (their keys wait: olderHeld),
		// done when none are. It returns the phase then. The rows of an
		// earlier epoch all have a txid below drain_below, which bounds
		// each partition's index range: the rows of the new epoch that
		// pile up behind the barrier are not read.
		lift: `WITH e AS (SELECT epoch, phase,
					coalesce(drain_below, pg_snapshot_xmax(pg_current_snapshot())) AS below FROM {schema}.outbox_epoch),
			lifted AS (
				UPDATE {schema}.outbox_epoch SET phase = CASE WHEN ` + olderHeldAny + ` THEN 'held' END
				WHERE phase IS NOT NULL AND (phase = 'drain' OR NOT ` + olderHeldAny + `)
				AND NOT EXISTS (
					SELECT 1 FROM {schema}.relay_partitions p WHERE EXISTS (
						SELECT 1 FROM {schema}.outbox o WHERE o.partition = p.partition
						AND (o.txid, o.seq) > (p.cursor_txid, p.cursor_seq) AND o.txid < (SELECT below FROM e)
						AND o.epoch < (SELECT epoch FROM e) AND NOT ` + held("o") + `))
				RETURNING phase)
			SELECT CASE WHEN EXISTS (SELECT FROM lifted) THEN (SELECT phase FROM lifted) ELSE (SELECT phase FROM e) END`,
		// The relays' partition count (the rows of relay_partitions), the
		// writers' (outbox_epoch), and the phase of a repartition.
		epochState: `SELECT ` + relayPartitionsExpr + `, e.partitions, e.phase FROM {schema}.outbox_epoch e`,
		// Retire the partitions of $2 that this relay ($1) holds beyond the
		// writers' count, once no repartition is under way and they hold no
		// row (retention deleted the published ones). No row can come:
		// writers use the count, and reading it waits for a repartition.
		retire: `DELETE FROM {schema}.relay_partitions p
			WHERE p.owner = $1 AND p.partition = ANY($2::int[])
			AND p.partition >= (SELECT partitions FROM {schema}.outbox_epoch WHERE phase IS NULL)
			AND NOT EXISTS (SELECT 1 FROM {schema}.outbox o WHERE o.partition = p.partition)
			RETURNING p.partition`,
	}
	q.relayPartitions = relayPartitionsSQL
	for _, p := range []*string{&q.lift, &q.epochState, &q.retire, &q.relayPartitions} {
		*p = pgsql.Render(*p, schema)
	}
	return q
}

// olderHeldAny is true while a held row with a key, of an epoch before the
// current one (e, in lift), is left.
const olderHeldAny = `EXISTS (SELECT 1 FROM {schema}.outbox h WHERE ` + "(h.parked_at IS NOT NULL OR h.next_attempt_at IS NOT NULL)" + `
	AND h.epoch < (SELECT epoch FROM e) AND h.ordering_key <> '')`

// relayPartitionsExpr is the relays' partition count: the rows 0 to N-1
// of relay_partitions.
const relayPartitionsExpr = `(SELECT coalesce(max(partition) + 1, 0)::int4 FROM {schema}.relay_partitions)`
