package idempotency

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/retention"
	"github.com/oncekit/oncekit/internal/wait"
)

// Prune runs one retention pass: it deletes expired completed and released
// records (past their Route.KeyTTL), Config.RetentionBatch rows per statement
// and at most Config.RetentionRate rows per second, until none is left, and
// returns how many it deleted; it also empties the response bodies past
// their Route.TTL.
// In-progress records are never touched, whatever their age. It also
// refreshes the in-progress gauges and the live records per operation and
// state.
func (e *Edge) Prune(ctx context.Context) (int64, error) {
	var total int64
	q := retention.Spaced(e.db, retention.Spacing(e.cfg.RetentionRate, e.cfg.RetentionBatch))
	from := time.Time{} // each batch starts at the last expiry the previous one deleted
	// With Config.OnExpire, expired records and bodies go one by one
	// through the hook instead of in bulk.
	hooked, hookErr := e.expireThroughHook(ctx)
	total += hooked
	if hookErr != nil && ctx.Err() != nil {
		return total, hookErr
	}
	for e.cfg.OnExpire == nil {
		var n int64
		if err := q.QueryRow(ctx, e.sql.prune, e.cfg.RetentionBatch, from).Scan(&n, &from); err != nil {
			return total, fmt.Errorf("idempotency: prune: %w", err)
		}
		total += n
		e.m.cleanedTotal.Add(float64(n))
		if n < int64(e.cfg.RetentionBatch) {
			break
		}
	}
	// Response bodies past their lifetime (TTL) are emptied; their records
	// keep the key's meaning (status, headers, times) until KeyTTL.
	for e.cfg.OnExpire == nil {
		var n int64
		if err := q.QueryRow(ctx, e.sql.purgeBodies, e.cfg.RetentionBatch).Scan(&n); err != nil {
			return total, fmt.Errorf("idempotency: prune responses: %w", err)
		}
		if n < int64(e.cfg.RetentionBatch) {
			break
		}
	}
	// Business keys past their lifetime (Route.BusinessKey.TTL) go too.
	for {
		var n int64
		if err := q.QueryRow(ctx, e.sql.pruneBusinessKeys, e.cfg.RetentionBatch).Scan(&n); err != nil {
			return total, fmt.Errorf("idempotency: prune business keys: %w", err)
		}
		if n < int64(e.cfg.RetentionBatch) {
			break
		}
	}
	if err := e.measureUnsettled(ctx); err != nil {
		return total, err
	}
	if err := e.measureLive(ctx); err != nil {
		return total, err
	}
	var count int64
	var oldest float64
	if err := e.db.QueryRow(ctx, e.sql.inProgress).Scan(&count, &oldest); err != nil {
		return total, fmt.Errorf("idempotency: prune: count in_progress: %w", err)
	}
	e.m.inProgress.Set(float64(count))
	e.m.oldestAge.Set(oldest)
	var lag float64
	if err := e.db.QueryRow(ctx, e.sql.cleanupLag).Scan(&lag); err != nil {
		return total, fmt.Errorf("idempotency: prune: cleanup lag: %w", err)
	}
	e.m.cleanupLag.Set(lag)
	return total, hookErr
}

// Run calls Prune every Config.RetentionInterval until ctx ends, and then
// returns nil. Errors are logged and retried at the next tick.
func (e *Edge) Run(ctx context.Context) error {
	wait.Every(ctx, e.cfg.RetentionInterval, func(ctx context.Context) {
		n, err := e.Prune(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			e.log.Error("idempotency: prune failed", "error", err)
		case n > 0:
			e.log.Debug("idempotency: prune", "deleted", n)
		}
	})
	return nil
}

// measureUnsettled refreshes the gauges of the records waiting for an
// outcome, per operation and state.
func (e *Edge) measureUnsettled(ctx context.Context) error {
	rows, err := e.db.Query(ctx, e.sql.unsettled)
	if err != nil {
		return fmt.Errorf("idempotency: prune: count unsettled: %w", err)
	}
	type gauge struct {
		operation, state string
		count            int64
		age              float64
	}
	got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (gauge, error) {
		var g gauge
		err := row.Scan(&g.operation, &g.state, &g.count, &g.age)
		return g, err
	})
	if err != nil {
		return fmt.Errorf("idempotency: prune: count unsettled: %w", err)
	}
	e.m.unsettled.Reset()
	e.m.unsettledAge.Reset()
	for _, g := range got {
		e.m.unsettled.WithLabelValues(g.operation, g.state).Set(float64(g.count))
		e.m.unsettledAge.WithLabelValues(g.operation, g.state).Set(g.age)
	}
	return nil
}
