package outbox

import (
	"context"
	"time"

	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/retention"
	"github.com/oncekit/oncekit/internal/wait"
)

// pruneLoop calls Prune every RetentionInterval. It is independent of
// publishing.
func (r *Relay) pruneLoop(ctx context.Context) {
	if r.cfg.Retention < 0 {
		return
	}
	for wait.Sleep(ctx, r.cfg.RetentionInterval) {
		n, err := r.Prune(ctx)
		if err != nil && ctx.Err() == nil {
			r.log.Warn("retention failed", "err", err)
		}
		if n > 0 {
			r.log.Info("retention deleted published rows", "rows", n)
		}
	}
}

// Prune runs one retention pass: it deletes published rows enqueued more
// than RelayConfig.Retention ago, a batch of RetentionBatch rows of each
// partition in turn, at most RetentionRate rows per second, and returns how
// many it deleted. Run calls it every RetentionInterval unless Retention is
// negative. Retention counts from Enqueue (created_at), not from
// publication: a message published late (after an outage or once unparked)
// may be deleted sooner after it went out.
//
// The partitions take turns because their rows share heap pages (events of
// every key are enqueued together): a round's batches delete from about the
// same pages while they are in shared_buffers, where passing one partition
// whole before the next read the whole history once per partition.
func (r *Relay) Prune(ctx context.Context) (int64, error) {
	var total int64
	q := retention.Spaced(r.pool, retention.Spacing(r.cfg.RetentionRate, r.cfg.RetentionBatch))
	// Each partition's batch starts after the last row its previous one
	// looked at.
	type front struct {
		partition int
		txid      string
		seq       int64
	}
	n, err := r.partitionCount(ctx)
	if err != nil {
		return 0, err
	}
	left := make([]front, n)
	for p := range left {
		left[p] = front{partition: p, txid: "0"}
	}
	for len(left) > 0 && ctx.Err() == nil {
		next := left[:0]
		for _, f := range left {
			var took, young bool
			var looked, deleted int64
			if err := q.QueryRow(ctx, r.sql.prune, f.partition, max(r.cfg.Retention, 0).Seconds(), r.cfg.RetentionBatch,
				f.txid, f.seq).Scan(&took, &looked, &deleted, &young, &f.txid, &f.seq); err != nil {
				return total, err
			}
			total += deleted
			// Done with the partition once its oldest published rows
			// include one within retention, or there are no more, or
			// another relay's pass is on it. (A batch may delete fewer than
			// it looked at without being done: rows a pass that just ended
			// its batch deleted after this statement's snapshot.)
			if took && !young && looked == int64(r.cfg.RetentionBatch) {
				next = append(next, f)
			}
		}
		left = next
	}
	return total, ctx.Err()
}

// statsLoop refreshes the gauges, oldest unpublished age and parked count,
// every StatsInterval, and at once (but no more than once a second) when a
// partition drains while the last figures showed a backlog: the age falls
// back to 0 with the backlog, not up to StatsInterval later.
func (r *Relay) statsLoop(ctx context.Context) {
	if r.m.reg == nil {
		return
	}
	gap := min(r.cfg.StatsInterval, time.Second)
	t := time.NewTicker(r.cfg.StatsInterval)
	defer t.Stop()
	for {
		last := time.Now()
		r.refreshStats(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.drained:
			if !wait.Sleep(ctx, gap-time.Since(last)) {
				return
			}
		}
	}
}

// partitionDrained tells the stats loop that a worker published its
// partition's backlog, when the gauges still show one.
func (r *Relay) partitionDrained() {
	if !r.backlogShown.Load() {
		return
	}
	select {
	case r.drained <- struct{}{}:
	default:
	}
}

func (r *Relay) refreshStats(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var age float64
	var pending, parked int64
	if err := pgsql.QueryRowNoJIT(ctx, r.pool, r.sql.oldest, nil, &pending, &age); err == nil {
		r.m.oldest.Set(age)
		r.backlogShown.Store(pending > 0)
	} else if ctx.Err() == nil {
		r.log.Warn("refreshing the backlog gauge failed", "err", err)
	}
	if err := r.pool.QueryRow(ctx, r.sql.parked).Scan(&parked); err == nil {
		r.m.parked.Set(float64(parked))
	}
}
