package sideeffect

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/crashpoint"
	"github.com/oncekit/oncekit/internal/pgsql"
)

// syncLoop runs the dispatcher's rounds. A round is one statement and one
// commit: the outcomes gathered since the last round and, while ctx lasts,
// a claim of due rows for the free call slots. Under load outcomes gather
// while a round runs, so rounds grow with the rate; when idle an outcome
// commits at once. A claim that came back short (no more due rows) is not
// repeated before PollInterval; one that filled its slots is repeated as
// soon as slots are free again; one that failed is repeated after a wait
// that grows while claims keep failing (claimBackoff).
//
// When ctx ends the loop stops claiming, calls stoppedClaiming, and goes on
// committing outcomes until results is closed.
func (d *Dispatcher) syncLoop(ctx context.Context, jobs chan<- job, results <-chan outcome, stoppedClaiming func()) {
	batch := make([]outcome, 0, d.cfg.FlushSize)
	var buf roundBuf
	poll := time.NewTimer(0)
	defer poll.Stop()
	claiming, polling := true, true // polling: waiting for the poll timer before claiming
	failing := d.claimBackoff()     // the wait after each of consecutive failed claims
	open := true                    // results not yet closed
	for {
		if claiming && ctx.Err() != nil {
			claiming = false
			stoppedClaiming()
		}
		if polling {
			select {
			case <-poll.C:
				polling = false
			default:
			}
		}
		open = gather(results, &batch, d.cfg.FlushSize) && open
		n := 0
		if claiming && !polling {
			d.sizeClaims(len(batch))
			minN := d.minClaim
			if d.inflight.Load() == 0 {
				minN = 1
			}
			n = d.reserve(minN)
		}
		if len(batch) == 0 && n == 0 {
			if !open {
				return
			}
			var done <-chan struct{}
			var wake <-chan struct{}
			var pollC <-chan time.Time
			if claiming {
				done, wake = ctx.Done(), d.wake
				if polling {
					pollC = poll.C
				}
			}
			select {
			case <-done:
			case <-wake:
			case <-pollC:
				polling = false
			case o, ok := <-results:
				if ok {
					batch = append(batch, o)
				} else {
					open = false
				}
			}
			continue
		}
		got, err := d.round(ctx, batch, n, jobs, &buf)
		batch = batch[:0]
		if n > 0 {
			d.setErr(err)
			switch {
			case err != nil:
				// The claim failed: look again after a wait that grows
				// while claims keep failing.
				polling = true
				poll.Reset(failing.Next())
			case got < n:
				// No more due rows: look again after the poll interval.
				failing.Reset()
				polling = true
				poll.Reset(d.cfg.PollInterval)
			default:
				failing.Reset()
			}
		}
	}
}

// gather appends the outcomes already waiting, up to limit in all, without
// blocking. It returns false when results is closed.
func gather(results <-chan outcome, batch *[]outcome, limit int) bool {
	for len(*batch) < limit {
		select {
		case o, ok := <-results:
			if !ok {
				return false
			}
			*batch = append(*batch, o)
		default:
			return true
		}
	}
	return true
}

// roundBuf holds a sync loop's buffers for claimed rows and committed
// outcomes, reused round after round: a claim can take a thousand rows.
type roundBuf struct {
	claimed []job
	done    []applied
}

// applied is an outcome the round committed.
type applied struct {
	kind, state string
	attempt     int
	firedFor    float64
}

// round commits the outcomes in batch and claims up to n due rows (n
// reserved slots) in one statement, then queues the claimed rows and gives
// back the slots they did not fill. A failed round leaves the outcomes'
// rows fired (their leases expire and recovery retries with the same keys)
// and claims nothing.
func (d *Dispatcher) round(ctx context.Context, batch []outcome, n int, jobs chan<- job, buf *roundBuf) (got int, err error) {
	defer func() { d.inflight.Add(int64(got - n)) }()
	k := len(batch)
	if k > 0 {
		crashpoint.Hit("sideeffect.before-complete")
	}
	startBy := d.startBy()
	// Not cancelled by shutdown: a round cut short would leave its outcome
	// unknown. Rows claimed after ctx ended are put back by the workers.
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	defer cancel()
	claimed := slices.Grow(buf.claimed[:0], n) // sized once: a job is ~150 bytes, regrowing copied each about twice
	done := slices.Grow(buf.done[:0], k)
	defer func() {
		// Queued by value: the buffers are reused, without the rows' payloads.
		clear(claimed)
		buf.claimed, buf.done = claimed[:0], done[:0]
	}()
	err = d.exec(qctx, d.sql.sync, d.syncArgs(batch, n),
		func(rows pgx.Rows) error {
			// One set of scan targets for the whole round: declared per row,
			// they and the argument slice escaped to the heap for every row.
			var isClaim bool
			var j job
			var a applied
			c := &j.call
			dest := []any{&isClaim, &c.ID, &c.SourceID, &c.Kind, &c.Payload, &c.Key, &c.Attempt, &c.RecordedAt, &c.Trace, &a.state, &a.firedFor}
			for rows.Next() {
				c.Payload, c.Trace = nil, nil // scanned into new ones, not over the last row's
				if err := rows.Scan(dest...); err != nil {
					return err
				}
				if isClaim {
					j.caps, j.startBy = d.caps[c.Kind], startBy
					claimed = append(claimed, j)
					continue
				}
				done = append(done, applied{kind: c.Kind, attempt: c.Attempt, state: a.state, firedFor: a.firedFor})
			}
			return rows.Err()
		})
	if err != nil && k > 0 && pgsql.Refused(err) {
		// One outcome PostgreSQL refuses must not lose the others: each is
		// committed on its own. The claim is made again next round.
		d.log.Warn("outcomes refused by PostgreSQL; committing them one by one", "n", k, "err", err)
		d.settleAlone(qctx, batch)
		return 0, nil
	}
	if err != nil {
		// A statement that cannot succeed as sent is logged by the watch,
		// once per cause and minute, not each round.
		broken := d.watch.Failed("sync", err)
		if k > 0 && !broken {
			d.log.Error("commit outcomes failed; leases will expire and recovery retries with the same keys", "n", k, "err", err)
		}
		if n > 0 && ctx.Err() == nil && !broken {
			d.log.Error("claim failed", "err", err)
		}
		return 0, fmt.Errorf("sideeffect: sync: %w", err)
	}
	d.watch.OK("sync")
	d.count(done, k)
	return handOut(claimed, true, jobs), nil
}

// syncArgs are the sync statement's arguments: the outcomes of batch to
// commit and a claim of up to n rows.
func (d *Dispatcher) syncArgs(batch []outcome, n int) []any {
	k := len(batch)
	ids := make([]int64, k)
	attempts := make([]int32, k)
	states := make([]string, k)
	refs := make([]*string, k)
	errs := make([]*string, k)
	delays := make([]float64, k)
	for i, o := range batch {
		ids[i], attempts[i], states[i], refs[i], errs[i], delays[i] =
			o.id, int32(o.attempt), o.state, o.ref, o.err, o.delay.Seconds()
	}
	return []any{d.cfg.ID, d.cfg.Lease, d.kinds, n, ids, attempts, states, refs, errs, delays}
}

// settleAlone commits each outcome of a round that PostgreSQL refused in a
// statement of its own, so that an outcome it refuses fails alone. Such an
// outcome is committed again without the provider's text (its state kept,
// its reference dropped, last_error saying why) and, if that is refused
// too, as unknown: an operator decides, and the effect is never fired
// again on its own. An outcome that fails otherwise (a lost connection) is
// left to its lease's expiry, as after any failed round.
func (d *Dispatcher) settleAlone(ctx context.Context, batch []outcome) {
	var done []applied
	for _, o := range batch {
		for _, try := range []outcome{o, withoutText(o, false), withoutText(o, true)} {
			a, err := d.commitAlone(ctx, try)
			if err == nil {
				done = append(done, a...)
				break
			}
			if !pgsql.Refused(err) {
				d.log.Error("commit outcome failed; its lease will expire and recovery takes over", "id", o.id, "kind", o.kind, "err", err)
				break
			}
			d.log.Warn("outcome refused by PostgreSQL", "id", o.id, "kind", o.kind, "state", try.state, "err", err)
		}
	}
	d.count(done, len(batch))
}

// withoutText is o without the provider's reference and error text, and
// unknown if asked: what is left to commit of an outcome PostgreSQL
// refused.
func withoutText(o outcome, unknown bool) outcome {
	msg := "the outcome's provider reference or error text was refused by PostgreSQL; check the provider"
	if unknown {
		o.state, o.delay = string(StateUnknown), 0
		msg = "the outcome could not be recorded (refused by PostgreSQL); the provider may have acted"
	}
	o.ref, o.err = nil, &msg
	return o
}

// commitAlone commits one outcome with no claim.
func (d *Dispatcher) commitAlone(ctx context.Context, o outcome) ([]applied, error) {
	var done []applied
	err := d.exec(ctx, d.sql.sync, d.syncArgs([]outcome{o}, 0), func(rows pgx.Rows) error {
		var a applied
		var isClaim bool
		var id int64
		var source, key string
		var payload, trace []byte
		var at time.Time
		for rows.Next() {
			if err := rows.Scan(&isClaim, &id, &source, &a.kind, &payload, &key, &a.attempt, &at, &trace, &a.state, &a.firedFor); err != nil {
				return err
			}
			done = append(done, a)
		}
		return rows.Err()
	})
	return done, err
}

// count updates the metrics for committed outcomes; k is how many were sent.
func (d *Dispatcher) count(done []applied, k int) {
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
	if len(done) < k {
		// Only after a lease was lost (this dispatcher stalled past it).
		d.log.Warn("outcomes dropped: lease no longer held", "dropped", k-len(done))
	}
}
