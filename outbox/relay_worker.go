package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/backoff"
	"github.com/oncekit/oncekit/internal/crashpoint"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/wait"
)

// worker publishes one partition while its relay holds the lease.
type worker struct {
	part       int
	token      int64
	validUntil atomic.Int64 // relay clock; no publishing after it
	lost       atomic.Bool
	// clean is true while the partition is known to have no held rows, so
	// that a batch needs no retry lookup. Only this worker writes held rows
	// of its partition (Unpark and retention never make a row held), so it
	// stays true until a batch leaves a row unacknowledged. Worker goroutine
	// only.
	clean bool
	// published is true once a batch published rows since the partition
	// was last found drained. Worker goroutine only.
	published bool
	wake      chan struct{}
	stop      chan struct{}
	stopOnce  sync.Once
	done      chan struct{}
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

func (w *worker) stopping() bool { return wait.Closed(w.stop) }

// Errors that end a batch early.
var (
	errLeaseLost  = errors.New("outbox: partition lease lost")
	errBrokerDown = errors.New("outbox: broker unreachable")
)

// runWorker drains the partition whenever poked, until stopped. ctx carries
// no cancellation: a batch in flight always finishes.
func (r *Relay) runWorker(ctx context.Context, w *worker) {
	defer func() {
		close(w.done)
		r.workerDone(w)
	}()
	bo := backoff.Policy{Min: min(100*time.Millisecond, r.cfg.MaxBrokerBackoff), Max: r.cfg.MaxBrokerBackoff, Jitter: 0.5}.Start()
	for {
		select {
		case <-w.stop:
			return
		case <-w.wake:
		}
		for !w.stopping() {
			full, err := r.processBatch(ctx, w)
			if err == nil {
				r.watch.OK("batch")
				bo.Reset()
				if !full {
					if w.published {
						w.published = false
						r.partitionDrained()
					}
					break
				}
				continue
			}
			if errors.Is(err, errLeaseLost) {
				w.lost.Store(true)
				w.signalStop()
				return
			}
			pause := bo.Next()
			if errors.Is(err, errBrokerDown) {
				r.m.failures.WithLabelValues("broker").Inc()
				r.log.Warn("broker unreachable; backing off", "partition", w.part, "wait", pause, "err", err)
			} else {
				r.failed("batch", err, "batch failed; backing off", "partition", w.part, "wait", pause)
			}
			t := time.NewTimer(pause)
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
	retry    bool // a held row read for its retry (behind the cursor)
	held     bool // held before this batch: parked, backing off or following
	due      bool // neither parked nor backing off
	keyHeld  bool // a main row whose key has held rows
}

// batch is one fetched batch and what became of each row.
type batch struct {
	rows    []outboxRow
	send    []int // rows to attempt, in order
	outcome []outcome
	errs    []error // of failed rows
	lost    bool    // the lease ran short while publishing
	down    bool    // nothing acknowledged, failures, broker unreachable: record nothing
	waves   int     // publish calls made
}

// processBatch reads, publishes and settles one batch of w's partition. full
// reports a batch of BatchSize rows (more may be waiting).
func (r *Relay) processBatch(ctx context.Context, w *worker) (full bool, err error) {
	if !r.leaseValid(w) {
		return false, nil // the lease loop renews it or gives it up
	}
	t0 := time.Now()
	rows, anyHeld, err := r.fetch(ctx, w)
	if err != nil || len(rows) == 0 {
		return false, err
	}
	t1 := time.Now()
	full = len(rows) == r.cfg.BatchSize
	r.m.batch.Observe(float64(len(rows)))

	b := r.publish(ctx, w, rows, choose(rows))
	if b.down {
		return false, errBrokerDown
	}
	crashpoint.Hit("relay.after-publish")
	t2 := time.Now()
	defer func() {
		r.log.Debug("batch", "partition", w.part, "rows", len(rows), "sent", len(b.send), "waves", b.waves,
			"fetch", t1.Sub(t0), "publish", t2.Sub(t1), "settle", time.Since(t2))
	}()

	nfailed, err := r.settle(ctx, w, b)
	if err != nil {
		w.clean = false
		return false, err
	}
	w.published = true
	w.clean = w.clean || !anyHeld
	for _, o := range b.outcome {
		if o != acked {
			w.clean = false // a row was held (or stayed held)
			break
		}
	}
	now := time.Now()
	nacked := 0
	for i, o := range b.outcome {
		if o == acked {
			nacked++
			r.m.lag.Observe(now.Sub(rows[i].created).Seconds())
		}
	}
	r.m.published.Add(float64(nacked))
	return full && nfailed == 0 && !b.lost && r.leaseValid(w), nil
}

// choose picks the rows of a batch to attempt, in order. A key is blocked
// for the rest of the batch from its first row that cannot go: a held row
// that is not due, or a main row of a key with held rows that were not read
// for a retry (their first one is not due).
func choose(rows []outboxRow) []int {
	send := make([]int, 0, len(rows))
	var blocked, retried map[string]bool
	block := func(k string) {
		if k != "" {
			if blocked == nil {
				blocked = map[string]bool{}
			}
			blocked[k] = true
		}
	}
	for i := range rows {
		row := &rows[i]
		k := row.msg.Key
		switch {
		case k != "" && blocked[k]:
			continue
		case !row.due:
			block(k)
			continue
		case row.retry && k != "":
			if retried == nil {
				retried = map[string]bool{}
			}
			retried[k] = true
		case row.keyHeld && !retried[k]:
			block(k)
			continue
		}
		send = append(send, i)
	}
	return send
}

// publish sends the rows of send (indexes into rows, in order) through
// the keyed publishing stage, bounded by PublishTimeout and by the lease:
// nothing is sent once this relay may no longer hold the partition.
func (r *Relay) publish(ctx context.Context, w *worker, rows []outboxRow, send []int) *batch {
	msgs := make([]broker.Message, len(send))
	for j, i := range send {
		msgs[j] = rows[i].msg
	}
	kp := keyedPublisher{
		pub: r.pub,
		timeout: func() time.Duration {
			return max(min(r.cfg.PublishTimeout, time.Duration(w.validUntil.Load())-r.since()), 0)
		},
		live: func() bool { return r.leaseValid(w) },
	}
	res := kp.publish(ctx, msgs)
	b := &batch{rows: rows, send: send, outcome: make([]outcome, len(rows)), errs: make([]error, len(rows)),
		lost: res.cut, down: res.down, waves: res.waves}
	for j, i := range send {
		b.outcome[i], b.errs[i] = res.outcome[j], res.errs[j]
	}
	return b
}

func (r *Relay) leaseValid(w *worker) bool {
	return int64(r.since()) < w.validUntil.Load()
}

// fetch reads a batch of w's partition; anyHeld reports held rows in the
// partition when the retry lookup ran (false otherwise).
func (r *Relay) fetch(ctx context.Context, w *worker) (out []outboxRow, anyHeld bool, err error) {
	if !r.syncStandbys.On(ctx, r.pool) {
		return r.fetchFrom(ctx, r.pool, w)
	}
	// With synchronous standbys, a row can be visible before the standby
	// has it (a commit whose wait was cancelled): the batch is read in a
	// transaction whose commit waits for the standby to have everything it
	// saw, and published only then (pgsql.SyncBarrierSQL).
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("outbox: fetch: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if out, anyHeld, err = r.fetchFrom(ctx, tx, w); err != nil || len(out) == 0 {
		return out, anyHeld, err
	}
	if _, err := tx.Exec(ctx, pgsql.SyncBarrierSQL); err != nil {
		return nil, false, fmt.Errorf("outbox: fetch: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, false, fmt.Errorf("outbox: fetch: waiting for the synchronous standby: %w", err)
	}
	return out, anyHeld, nil
}

// fetchFrom reads one batch of w's partition through q.
func (r *Relay) fetchFrom(ctx context.Context, q oncekit.Querier, w *worker) (out []outboxRow, anyHeld bool, err error) {
	stmt := r.sql.fetch
	if w.clean {
		stmt = r.sql.fetchMain
	}
	rows, err := q.Query(ctx, stmt, w.part, r.cfg.ID, w.token, r.cfg.BatchSize)
	if err != nil {
		return nil, false, fmt.Errorf("outbox: fetch: %w", err)
	}
	defer rows.Close()
	out = make([]outboxRow, 0, r.cfg.BatchSize)
	var headers []byte // reused: only decoded, never kept
	var barred bool
	for rows.Next() {
		out = append(out, outboxRow{})
		row := &out[len(out)-1]
		headers = headers[:0]
		// The ID is scanned as its 16 bytes: through uuid.UUID's
		// sql.Scanner pgx would format it as text and parse it back.
		if err := rows.Scan(&row.retry, &row.seq, (*[16]byte)(&row.msg.ID), &row.msg.Key, &row.msg.Subject, &row.msg.Payload,
			&headers, &row.created, &row.attempts, &row.held, &row.due, &row.keyHeld, &anyHeld, &barred); err != nil {
			return nil, false, fmt.Errorf("outbox: fetch: %w", err)
		}
		if barred && !noBarrier.Load() {
			// A row of the epoch after a repartition, which waits until
			// every row of the epochs before it is out: the batch ends
			// before it (the cursor must not pass it), and the relay
			// watches for the barrier to lift.
			out = out[:len(out)-1]
			r.barred(w)
			break
		}
		if len(headers) > 0 {
			if err := json.Unmarshal(headers, &row.msg.Headers); err != nil {
				return nil, false, fmt.Errorf("outbox: row %d: headers: %w", row.seq, err)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("outbox: fetch: %w", err)
	}
	return out, anyHeld, nil
}
