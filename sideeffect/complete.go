package sideeffect

import (
	"context"

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
	rows, err := d.db.Query(ctx, d.sql.complete, d.cfg.ID, ids, attempts, states, refs, errs, delays)
	if err != nil {
		d.log.Error("commit outcomes failed; leases will expire and recovery retries with the same keys", "n", n, "err", err)
		return
	}
	var applied int
	for rows.Next() {
		var kind, state string
		var attempt int
		var firedFor float64
		if err := rows.Scan(&kind, &state, &attempt, &firedFor); err != nil {
			break
		}
		applied++
		if state == string(StateFired) {
			continue // waiting for a lookup: no transition
		}
		if caps := d.caps[kind]; caps != nil && state == string(StateConfirmed) {
			caps.m.confirmed.Inc()
			caps.m.toConfirmed.Observe(firedFor)
			caps.m.attemptsOK.Observe(float64(attempt))
			continue
		}
		d.m.transitions.WithLabelValues(kind, state).Inc()
		switch State(state) {
		case StateConfirmed:
			d.m.firedToConfirmed.WithLabelValues(kind).Observe(firedFor)
			d.m.attempts.WithLabelValues(kind, state).Observe(float64(attempt))
		case StateFailed, StateUnknown:
			d.m.attempts.WithLabelValues(kind, state).Observe(float64(attempt))
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		d.log.Error("commit outcomes failed; leases will expire and recovery retries with the same keys", "n", n, "err", err)
		return
	}
	if applied < n {
		// Only after a lease was lost (this dispatcher stalled past it).
		d.log.Warn("outcomes dropped: lease no longer held", "dropped", n-applied)
	}
}
