package sideeffect

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/crashpoint"
)

// completeLoop commits outcomes in batches: it blocks for one, takes every
// other outcome already waiting (up to FlushSize) and commits them in one
// statement. Under load batches grow; when idle an outcome commits at once.
func (d *Dispatcher) completeLoop(ctx context.Context, results <-chan outcome) {
	batch := make([]outcome, 0, d.cfg.FlushSize)
	for o := range results {
		batch = append(batch[:0], o)
	drain:
		for len(batch) < d.cfg.FlushSize {
			select {
			case o, ok := <-results:
				if !ok {
					break drain
				}
				batch = append(batch, o)
			default:
				break drain
			}
		}
		crashpoint.Hit("sideeffect.before-complete")
		d.flush(ctx, batch)
	}
}

// flush commits one batch of outcomes. A failed flush leaves the rows fired;
// their leases expire and recovery takes over with the same keys.
func (d *Dispatcher) flush(ctx context.Context, batch []outcome) {
	n := len(batch)
	ids := make([]int64, n)
	attempts := make([]int32, n)
	states := make([]string, n)
	refs := make([]*string, n)
	errs := make([]*string, n)
	delays := make([]float64, n)
	for i, o := range batch {
		ids[i], attempts[i], states[i], refs[i], errs[i], delays[i] =
			o.id, int32(o.attempt), o.state, o.ref, o.err, o.delay.Seconds()
	}
	// The rows applied, counted once the statement has committed.
	type applied struct {
		kind, state string
		attempt     int
		firedFor    float64
	}
	done := make([]applied, 0, n)
	err := d.exec(ctx, d.sql.complete, []any{d.cfg.ID, ids, attempts, states, refs, errs, delays}, func(rows pgx.Rows) error {
		for rows.Next() {
			var a applied
			if err := rows.Scan(&a.kind, &a.state, &a.attempt, &a.firedFor); err != nil {
				return err
			}
			done = append(done, a)
		}
		return rows.Err()
	})
	if err != nil {
		d.log.Error("commit outcomes failed; leases will expire and recovery retries with the same keys", "n", n, "err", err)
		return
	}
	for _, a := range done {
		if a.state == string(StateFired) {
			continue // waiting for a lookup: no transition
		}
		if caps := d.caps[a.kind]; caps != nil && a.state == string(StateConfirmed) {
			caps.m.confirmed.Inc()
			caps.m.toConfirmed.Observe(a.firedFor)
			caps.m.attemptsOK.Observe(float64(a.attempt))
			continue
		}
		d.m.transitions.WithLabelValues(a.kind, a.state).Inc()
		switch State(a.state) {
		case StateConfirmed:
			d.m.firedToConfirmed.WithLabelValues(a.kind).Observe(a.firedFor)
			d.m.attempts.WithLabelValues(a.kind, a.state).Observe(float64(a.attempt))
		case StateFailed, StateUnknown:
			d.m.attempts.WithLabelValues(a.kind, a.state).Observe(float64(a.attempt))
		}
	}
	if len(done) < n {
		// Only after a lease was lost (this dispatcher stalled past it).
		d.log.Warn("outcomes dropped: lease no longer held", "dropped", n-len(done))
	}
}
