package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/crashpoint"
)

// worker publishes one partition while its relay holds the lease.
type worker struct {
	part       int
	token      int64
	validUntil atomic.Int64 // relay clock; no publishing after it
	lost       atomic.Bool
	wake       chan struct{}
	stop       chan struct{}
	stopOnce   sync.Once
	done       chan struct{}
}

func newWorker(part int, token int64) *worker {
	return &worker{part: part, token: token, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
}

func (w *worker) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *worker) signalStop() { w.stopOnce.Do(func() { close(w.stop) }) }

func (w *worker) stopping() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

// Errors that end a batch early.
var (
	errLeaseLost  = errors.New("outbox: partition lease lost")
	errBrokerDown = errors.New("outbox: broker unreachable")
)

// connectedPublisher is implemented by publishers that know whether their
// broker is reachable (natsjs.Publisher does). When every message of a round
// fails while the broker is unreachable, the failures are the broker's, not
// the messages': no attempt is counted.
type connectedPublisher interface{ Connected() bool }

// runWorker drains the partition whenever poked, until stopped. ctx carries
// no cancellation: a batch in flight always finishes.
func (r *Relay) runWorker(ctx context.Context, w *worker) {
	defer func() {
		close(w.done)
		r.workerDone(w)
	}()
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 100 * time.Millisecond
	bo.MaxInterval = r.cfg.BrokerBackoffMax
	bo.MaxElapsedTime = 0
	for {
		select {
		case <-w.stop:
			return
		case <-w.wake:
		}
		for !w.stopping() {
			full, err := r.processBatch(ctx, w)
			if err == nil {
				bo.Reset()
				if !full {
					break
				}
				continue
			}
			if errors.Is(err, errLeaseLost) {
				w.lost.Store(true)
				w.signalStop()
				return
			}
			wait := bo.NextBackOff()
			if errors.Is(err, errBrokerDown) {
				r.m.failures.WithLabelValues("broker").Inc()
				r.log.Warn("broker unreachable; backing off", "partition", w.part, "wait", wait, "err", err)
			} else {
				r.log.Warn("batch failed; backing off", "partition", w.part, "wait", wait, "err", err)
			}
			t := time.NewTimer(wait)
			select {
			case <-w.stop:
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

type outboxRow struct {
	seq      int64
	attempts int
	msg      broker.Message
	created  time.Time
}

// processBatch reads, publishes and marks one batch of w's partition. full
// reports a batch of BatchSize rows (more may be waiting).
func (r *Relay) processBatch(ctx context.Context, w *worker) (full bool, err error) {
	if !r.leaseValid(w) {
		return false, nil // the lease loop renews it or gives it up
	}
	t0 := time.Now()
	rows, err := r.fetch(ctx, w)
	if err != nil || len(rows) == 0 {
		return false, err
	}
	t1 := time.Now()
	full = len(rows) == r.cfg.BatchSize
	r.m.batch.Observe(float64(len(rows)))

	var acked []int64
	var failed []failure
	var lagged []time.Time
	var down, lost bool
	nwaves := 1
	if cp, ok := r.pub.(chainPublisher); ok {
		acked, failed, lagged, down = r.publishChained(ctx, w, cp, rows)
	} else {
		acked, failed, lagged, down, lost, nwaves = r.publishWaves(ctx, w, rows)
	}
	if down {
		return false, errBrokerDown
	}
	crashpoint.Hit("relay.after-publish")
	t2 := time.Now()
	defer func() {
		r.log.Debug("batch", "partition", w.part, "rows", len(rows), "waves", nwaves, "fetch", t1.Sub(t0), "publish", t2.Sub(t1), "mark", time.Since(t2))
	}()

	if err := r.mark(ctx, w, acked, failed); err != nil {
		return false, err
	}
	now := time.Now()
	for _, c := range lagged {
		r.m.lag.Observe(now.Sub(c).Seconds())
	}
	r.m.published.Add(float64(len(acked)))
	if lost {
		return false, errLeaseLost
	}
	return full && len(failed) == 0 && r.leaseValid(w), nil
}

// chainPublisher is implemented by publishers that can keep per-key order
// within one batch without a round trip per message (natsjs.Publisher does):
// msgs[i] is sent only after msgs[prev[i]] was acknowledged, never when it
// failed.
type chainPublisher interface {
	PublishChain(ctx context.Context, msgs []broker.Message, prev []int) []broker.Result
}

// publishCtx bounds a publish by PublishTimeout and by the lease: nothing is
// sent once this relay may no longer hold the partition.
func (r *Relay) publishCtx(ctx context.Context, w *worker) (context.Context, context.CancelFunc) {
	left := time.Duration(w.validUntil.Load()) - r.since()
	return context.WithTimeout(ctx, max(min(r.cfg.PublishTimeout, left), 0))
}

// publishChained publishes rows in one round, each key's rows chained.
func (r *Relay) publishChained(ctx context.Context, w *worker, cp chainPublisher, rows []outboxRow) (acked []int64, failed []failure, lagged []time.Time, down bool) {
	msgs := make([]broker.Message, len(rows))
	prev := make([]int, len(rows))
	last := make(map[string]int, len(rows))
	for i := range rows {
		row := &rows[i]
		msgs[i] = row.msg
		prev[i] = -1
		if k := row.msg.Key; k != "" {
			if j, ok := last[k]; ok {
				prev[i] = j
			}
			last[k] = i
		}
	}
	pctx, cancel := r.publishCtx(ctx, w)
	results := cp.PublishChain(pctx, msgs, prev)
	cancel()
	lost := !r.leaseValid(w)
	skipped := make([]bool, len(rows))
	acked = make([]int64, 0, len(rows))
	lagged = make([]time.Time, 0, len(rows))
	for i, res := range results {
		switch {
		case res.Err == nil:
			acked = append(acked, rows[i].seq)
			lagged = append(lagged, rows[i].created)
		case prev[i] >= 0 && (skipped[prev[i]] || results[prev[i]].Err != nil):
			skipped[i] = true // not attempted: blocked behind its key's failure
		case lost:
			skipped[i] = true // cut short by the lease: not the message's fault
		default:
			failed = append(failed, failure{seq: rows[i].seq, attempts: rows[i].attempts, err: res.Err})
		}
	}
	if len(acked) == 0 && len(failed) > 0 && r.brokerDown() {
		return nil, nil, nil, true
	}
	return acked, failed, lagged, false
}

// publishWaves is the fallback for publishers without PublishChain: rounds
// holding at most one row per key, a key's next row sent in the next round.
func (r *Relay) publishWaves(ctx context.Context, w *worker, rows []outboxRow) (acked []int64, failed []failure, lagged []time.Time, down, lost bool, nwaves int) {
	blocked := map[string]bool{}
	for _, wave := range waves(rows) {
		batch := make([]outboxRow, 0, len(wave))
		for _, row := range wave {
			if row.msg.Key == "" || !blocked[row.msg.Key] {
				batch = append(batch, row)
			}
		}
		if len(batch) == 0 {
			continue
		}
		if !r.leaseValid(w) {
			lost = true // publish nothing more; mark what was acked
			break
		}
		nwaves++
		msgs := make([]broker.Message, len(batch))
		for i, row := range batch {
			msgs[i] = row.msg
		}
		pctx, cancel := r.publishCtx(ctx, w)
		results := r.pub.Publish(pctx, msgs)
		cancel()
		okInRound := 0
		for i, res := range results {
			if res.Err == nil {
				acked = append(acked, batch[i].seq)
				lagged = append(lagged, batch[i].created)
				okInRound++
				continue
			}
			failed = append(failed, failure{seq: batch[i].seq, attempts: batch[i].attempts, err: res.Err})
			if k := batch[i].msg.Key; k != "" {
				blocked[k] = true // the rest of this key waits for the retry
			}
		}
		if okInRound == 0 && len(acked) == 0 && r.brokerDown() {
			return nil, nil, nil, true, false, nwaves
		}
	}
	return acked, failed, lagged, false, lost, nwaves
}

func (r *Relay) leaseValid(w *worker) bool {
	return int64(r.since()) < w.validUntil.Load()
}

func (r *Relay) brokerDown() bool {
	cp, ok := r.pub.(connectedPublisher)
	return ok && !cp.Connected()
}

func (r *Relay) fetch(ctx context.Context, w *worker) ([]outboxRow, error) {
	rows, err := r.pool.Query(ctx, r.sql.fetch, w.part, r.cfg.NodeID, w.token, r.cfg.BatchSize)
	if err != nil {
		return nil, fmt.Errorf("outbox: fetch: %w", err)
	}
	defer rows.Close()
	out := make([]outboxRow, 0, r.cfg.BatchSize)
	var headers []byte // reused: only decoded, never kept
	for rows.Next() {
		out = append(out, outboxRow{})
		row := &out[len(out)-1]
		headers = headers[:0]
		// The ID is scanned as its 16 bytes: through uuid.UUID's
		// sql.Scanner pgx would format it as text and parse it back.
		if err := rows.Scan(&row.seq, (*[16]byte)(&row.msg.ID), &row.msg.Key, &row.msg.Subject, &row.msg.Payload, &headers, &row.created, &row.attempts); err != nil {
			return nil, fmt.Errorf("outbox: fetch: %w", err)
		}
		if len(headers) > 0 {
			if err := json.Unmarshal(headers, &row.msg.Headers); err != nil {
				return nil, fmt.Errorf("outbox: row %d: headers: %w", row.seq, err)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: fetch: %w", err)
	}
	return out, nil
}

// waves splits rows (in commit order) into publish rounds holding at most one
// row per ordering key, so that a key's next message is sent only after the
// previous one was acknowledged. Rows without a key all go in the first round.
func waves(rows []outboxRow) [][]outboxRow {
	var out [][]outboxRow
	depth := map[string]int{}
	for _, row := range rows {
		i := 0
		if row.msg.Key != "" {
			i = depth[row.msg.Key]
			depth[row.msg.Key] = i + 1
		}
		if i == len(out) {
			out = append(out, nil)
		}
		out[i] = append(out[i], row)
	}
	return out
}

type failure struct {
	seq      int64
	attempts int
	err      error
}

// mark records the batch's outcome in one round trip, fenced by the lease
// token: acked rows are published, failed ones wait or are parked.
func (r *Relay) mark(ctx context.Context, w *worker, acked []int64, failed []failure) error {
	if len(acked) == 0 && len(failed) == 0 {
		return nil
	}
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	stmt := r.sql.markPublished
	if r.cfg.DeleteOnPublish {
		stmt = r.sql.deletePublished
	}
	checkMarked := func(marked int64) error {
		if marked < int64(len(acked)) {
			r.log.Warn("lease lost before marking; the new owner republishes (deduplicated)", "partition", w.part,
				"acked", len(acked), "marked", marked)
			return errLeaseLost
		}
		return nil
	}
	if len(failed) == 0 { // the common case: one statement, one round trip
		var marked int64
		if err := r.pool.QueryRow(mctx, stmt, w.part, r.cfg.NodeID, w.token, acked).Scan(&marked); err != nil {
			return fmt.Errorf("outbox: mark published: %w", err)
		}
		return checkMarked(marked)
	}
	tx, err := r.pool.Begin(mctx)
	if err != nil {
		return fmt.Errorf("outbox: mark: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(mctx)) }()
	if len(acked) > 0 {
		var marked int64
		if err := tx.QueryRow(mctx, stmt, w.part, r.cfg.NodeID, w.token, acked).Scan(&marked); err != nil {
			return fmt.Errorf("outbox: mark published: %w", err)
		}
		if err := checkMarked(marked); err != nil {
			return err
		}
	}
	if len(failed) > 0 {
		seqs := make([]int64, len(failed))
		errs := make([]string, len(failed))
		delays := make([]float64, len(failed))
		for i, f := range failed {
			seqs[i], errs[i] = f.seq, f.err.Error()
			delays[i] = r.retryDelay(f.attempts).Seconds()
		}
		rows, err := tx.Query(mctx, r.sql.markFailed, w.part, r.cfg.NodeID, w.token, seqs, errs, delays, r.cfg.MaxAttempts)
		if err != nil {
			return fmt.Errorf("outbox: mark failed: %w", err)
		}
		parked := 0
		for rows.Next() {
			var p bool
			if err := rows.Scan(&p); err != nil {
				rows.Close()
				return fmt.Errorf("outbox: mark failed: %w", err)
			}
			if p {
				parked++
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("outbox: mark failed: %w", err)
		}
		r.m.failures.WithLabelValues("message").Add(float64(len(failed)))
		r.log.Warn("publish failed; key blocked until retry", "partition", w.part, "failed", len(failed),
			"parked", parked, "err", failed[0].err)
	}
	if err := tx.Commit(mctx); err != nil {
		return fmt.Errorf("outbox: mark: %w", err)
	}
	return nil
}

// retryDelay is the wait before attempt n+1 of a failed message: exponential
// from RetryInitial, capped at RetryMax, with ±20% jitter.
func (r *Relay) retryDelay(n int) time.Duration {
	d := float64(r.cfg.RetryInitial) * math.Pow(2, float64(n))
	if d > float64(r.cfg.RetryMax) {
		d = float64(r.cfg.RetryMax)
	}
	return time.Duration(d * (0.8 + 0.4*rand.Float64()))
}
