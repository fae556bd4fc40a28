package outbox

import (
	"context"
	"time"
)

// retentionLoop deletes rows published more than Retention ago, in batches of
// RetentionBatch, every RetentionInterval. It is independent of publishing.
func (r *Relay) retentionLoop(ctx context.Context) {
	if r.cfg.Retention < 0 {
		return
	}
	for sleep(ctx, r.cfg.RetentionInterval) {
		n, err := r.DeletePublished(ctx)
		if err != nil && ctx.Err() == nil {
			r.log.Warn("retention failed", "err", err)
		}
		if n > 0 {
			r.log.Info("retention deleted published rows", "rows", n)
		}
	}
}

// DeletePublished runs one retention pass: it deletes rows published more
// than RelayConfig.Retention ago, in bounded batches, and returns how many.
func (r *Relay) DeletePublished(ctx context.Context) (int64, error) {
	var total int64
	for ctx.Err() == nil {
		tag, err := r.pool.Exec(ctx, r.sql.deleteBatch, max(r.cfg.Retention, 0).Seconds(), r.cfg.RetentionBatch)
		if err != nil {
			return total, err
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(r.cfg.RetentionBatch) {
			break
		}
	}
	return total, ctx.Err()
}

// statsLoop refreshes the gauges: oldest unpublished age and parked count.
func (r *Relay) statsLoop(ctx context.Context) {
	if r.m.reg == nil {
		return
	}
	for {
		r.refreshStats(ctx)
		if !sleep(ctx, r.cfg.StatsInterval) {
			return
		}
	}
}

func (r *Relay) refreshStats(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var age float64
	var parked int64
	if err := r.pool.QueryRow(ctx, r.sql.oldest).Scan(&age); err == nil {
		r.m.oldest.Set(age)
	}
	if err := r.pool.QueryRow(ctx, r.sql.parked).Scan(&parked); err == nil {
		r.m.parked.Set(float64(parked))
	}
}
