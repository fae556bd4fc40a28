package sideeffect

import (
	"context"
	"time"

	"github.com/oncekit/oncekit/internal/retention"
)

// maintainLoop runs recovery of expired leases (and refreshes the unknown
// gauge) every RecoverInterval, and Prune every RetentionInterval.
func (d *Dispatcher) maintainLoop(ctx context.Context, jobs chan<- job) {
	recoverT := time.NewTicker(d.cfg.RecoverInterval)
	defer recoverT.Stop()
	var retention <-chan time.Time
	if d.cfg.Retention > 0 {
		t := time.NewTicker(d.cfg.RetentionInterval)
		defer t.Stop()
		retention = t.C
	}
	d.recover(ctx, jobs)
	for {
		select {
		case <-ctx.Done():
			return
		case <-recoverT.C:
			d.recover(ctx, jobs)
		case <-retention:
			n, err := d.Prune(ctx)
			if err != nil && ctx.Err() == nil {
				d.log.Error("retention failed", "err", err)
			}
			if n > 0 {
				d.log.Info("retention deleted effects", "n", n)
			}
		}
	}
}

// recover deals with fired rows whose lease expired: fired again with the
// same key, reconciled through the provider's lookup, or moved to unknown,
// according to the kind's provider.
func (d *Dispatcher) recover(ctx context.Context, jobs chan<- job) {
	if len(d.unknown) > 0 {
		rows, err := d.db.Query(ctx, d.sql.markUnknown, d.unknown, d.cfg.BatchSize)
		if err == nil {
			for rows.Next() {
				var kind string
				if rows.Scan(&kind) == nil {
					d.m.transitions.WithLabelValues(kind, string(StateUnknown)).Inc()
					d.log.Warn("effect outcome unknown: lease expired while fired; an operator must decide", "kind", kind)
				}
			}
			rows.Close()
			err = rows.Err()
		}
		if err != nil && ctx.Err() == nil {
			d.log.Error("recovery: mark unknown failed", "err", err)
		}
	}
	for _, r := range []struct {
		query  string
		kinds  []string
		lookup bool
	}{{d.sql.refire, d.refire, false}, {d.sql.reconcile, d.lookup, true}} {
		if len(r.kinds) == 0 {
			continue
		}
		n, err := d.claim(ctx, r.query, r.kinds, d.reserve(1), r.lookup, jobs)
		switch {
		case err == nil:
			d.watch.OK("recovery")
		case ctx.Err() == nil && !d.watch.Failed("recovery", err):
			d.log.Error("recovery: claim expired leases failed", "err", err)
		}
		if n > 0 {
			d.log.Warn("recovering effects whose lease expired (a dispatcher died mid-call)", "n", n, "lookup", r.lookup)
		}
	}
	d.refreshUnknown(ctx)
}

// refreshUnknown sets the unknown gauge for this dispatcher's kinds.
func (d *Dispatcher) refreshUnknown(ctx context.Context) {
	rows, err := d.db.Query(ctx, d.sql.countUnknown)
	if err != nil {
		return
	}
	counts := map[string]float64{}
	for rows.Next() {
		var kind string
		var n int64
		if rows.Scan(&kind, &n) == nil {
			counts[kind] = float64(n)
		}
	}
	rows.Close()
	if rows.Err() != nil {
		return
	}
	for _, k := range d.kinds {
		d.m.unknown.WithLabelValues(k).Set(counts[k])
	}
}

// Prune runs one retention pass: it deletes the confirmed and failed effects
// recorded more than DispatcherConfig.Retention ago, RetentionBatch rows per
// statement and at most RetentionRate rows per second, and returns how many
// it deleted (Ledger.Prune). It deletes
// nothing when Retention is negative. Run calls it every RetentionInterval.
func (d *Dispatcher) Prune(ctx context.Context) (int64, error) {
	if d.cfg.Retention < 0 {
		return 0, nil
	}
	l := d.ledger
	q := retention.Spaced(d.db, retention.Spacing(d.cfg.RetentionRate, d.cfg.RetentionBatch))
	return l.Prune(ctx, q, time.Now().Add(-d.cfg.Retention), d.cfg.RetentionBatch)
}
