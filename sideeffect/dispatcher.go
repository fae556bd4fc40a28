package sideeffect

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/cfgerr"
	"github.com/oncekit/oncekit/internal/crashpoint"
	"github.com/oncekit/oncekit/internal/nodeid"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/retention"
)

// DispatcherConfig configures a Dispatcher. The zero value works.
type DispatcherConfig struct {
	// ID names this dispatcher as the owner of the leases it takes; it must
	// be unique among running dispatchers, valid UTF-8 without control
	// characters, at most 255 bytes. Defaults to host-pid-random.
	ID string
	// Concurrency is how many provider calls run at once. Defaults to 32.
	Concurrency int
	// BatchSize is how many rows one statement claims (and commits as
	// fired) while calls finish no faster than rounds commit them. When more
	// calls finish during a round, a claim takes up to four times as many
	// rows as the round committed, at most 5×BatchSize, so that the callers
	// do not run dry while the next round commits. A dispatcher holds at
	// most 2×Concurrency plus the current claim size of claimed rows (in a
	// call or queued for one). Defaults to 200.
	BatchSize int
	// FlushSize caps the outcomes committed by one statement. Defaults to 500.
	FlushSize int
	// PollInterval is how long the dispatcher waits before looking for due
	// effects again after finding none. A claim that fails (PostgreSQL
	// unreachable, a grant missing) is tried again after PollInterval,
	// doubling with each consecutive failure (±20 %), at most MaxBackoff or
	// 10s, whichever is shorter. Defaults to 200ms.
	PollInterval time.Duration
	// CallTimeout bounds each provider call (and lookup). Defaults to 30s.
	CallTimeout time.Duration
	// Lease is how long a fired row belongs to this dispatcher; when it
	// expires without an outcome the dispatcher is presumed dead and
	// recovery takes over. Must exceed CallTimeout. Defaults to
	// 2×CallTimeout + 10s.
	Lease time.Duration
	// RecoverInterval is how often expired leases are looked for and the
	// unknown gauge is refreshed. Defaults to 5s.
	RecoverInterval time.Duration
	// MinBackoff and MaxBackoff bound the exponential backoff between
	// attempts after indefinite errors. Default to 1s and 10m.
	MinBackoff, MaxBackoff time.Duration
	// MaxRetryAfter caps the delay a provider may ask for with Retry-After.
	// Defaults to 1h.
	MaxRetryAfter time.Duration
	// MaxAttempts is the attempt after which an indefinite error gives up:
	// the effect becomes unknown (the provider may have acted). Defaults to 25.
	MaxAttempts int
	// Retention is how long (since they were recorded) confirmed and failed
	// effects are kept before
	// the dispatcher deletes them in batches. Keep it longer than any
	// redelivery or retry of the effects' sources: a deleted effect can be
	// recorded again. Negative disables deletion. Defaults to 30 days.
	Retention time.Duration
	// RetentionInterval is the period of the retention loop. Defaults to
	// oncekit.DefaultRetentionInterval.
	RetentionInterval time.Duration
	// RetentionBatch is the most rows one retention DELETE removes.
	// Defaults to oncekit.DefaultRetentionBatch.
	RetentionBatch int
	// RetentionRate is the most rows a retention pass deletes per second
	// (negative: no limit). Defaults to oncekit.DefaultRetentionRate.
	RetentionRate int
	// Logger receives the dispatcher's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the dispatcher's metrics (namespace oncekit,
	// subsystem sideeffect). Nil means no metrics. Several dispatchers may
	// share one registerer.
	Registerer prometheus.Registerer
}

// withDefaults returns a copy of c (the zero DispatcherConfig if nil) with
// defaults set.
func (c *DispatcherConfig) withDefaults() DispatcherConfig {
	out := cfgerr.CopyOf(c)
	if out.ID == "" {
		out.ID = nodeid.New()
	}
	out.Concurrency = cmp.Or(out.Concurrency, 32)
	out.BatchSize = cmp.Or(out.BatchSize, 200)
	out.FlushSize = cmp.Or(out.FlushSize, 500)
	out.MaxAttempts = cmp.Or(out.MaxAttempts, 25)
	out.PollInterval = cmp.Or(out.PollInterval, 200*time.Millisecond)
	out.CallTimeout = cmp.Or(out.CallTimeout, 30*time.Second)
	out.Lease = cmp.Or(out.Lease, 2*out.CallTimeout+10*time.Second)
	out.RecoverInterval = cmp.Or(out.RecoverInterval, 5*time.Second)
	out.MinBackoff = cmp.Or(out.MinBackoff, time.Second)
	out.MaxBackoff = cmp.Or(out.MaxBackoff, 10*time.Minute)
	out.MaxRetryAfter = cmp.Or(out.MaxRetryAfter, time.Hour)
	out.Retention = cmp.Or(out.Retention, 30*24*time.Hour)
	retention.Defaults(&out.RetentionInterval, &out.RetentionBatch, &out.RetentionRate)
	out.Logger = cmp.Or(out.Logger, slog.Default())
	return out
}

// validate returns an error naming the first bad field, wrapping
// ErrInvalidConfig.
func (c *DispatcherConfig) validate() error {
	bad := cfgerr.For(ErrInvalidConfig, "sideeffect: DispatcherConfig")
	if err := bad.IfNegative(c, "Concurrency", "BatchSize", "FlushSize", "MaxAttempts",
		"PollInterval", "CallTimeout", "Lease", "RecoverInterval", "MinBackoff", "MaxBackoff",
		"MaxRetryAfter", "RetentionInterval", "RetentionBatch"); err != nil {
		return err
	}
	if err := bad.IfNotID(c, "ID"); err != nil {
		return err
	}
	if c.Lease <= c.CallTimeout {
		return bad("Lease", "%v must exceed CallTimeout (%v), or a slow call could be fired twice at once", c.Lease, c.CallTimeout)
	}
	if c.MaxBackoff < c.MinBackoff {
		return bad("MaxBackoff", "%v is below MinBackoff (%v)", c.MaxBackoff, c.MinBackoff)
	}
	return nil
}

// Dispatcher fires recorded effects through their kinds' providers. Several
// dispatchers (processes or goroutines) may run on one table: rows are
// claimed with SKIP LOCKED and fenced by lease owner and attempt, so no row is
// fired by two dispatchers at once while leases are honoured.
type Dispatcher struct {
	ledger  *Ledger // the schema's statements and the propagator
	db      oncekit.DB
	cfg     DispatcherConfig
	log     *slog.Logger
	sql     statements
	m       *metrics
	caps    map[string]*capabilities
	kinds   []string // every kind with a provider
	refire  []string // kinds whose expired fired rows are fired again
	lookup  []string // kinds whose expired fired rows are reconciled
	unknown []string // kinds whose expired fired rows become unknown

	running  atomic.Bool
	inflight atomic.Int64
	minClaim int64 // the fewest free slots worth a claim while calls are in flight
	// claimSize is the most rows one claim takes now: from BatchSize up to
	// maxClaim, following the rate calls finish (see sizeClaims).
	claimSize atomic.Int64
	maxClaim  int64
	wake      chan struct{}
	lastErr   atomic.Pointer[error]
	// watch makes the statements that cannot succeed as sent errors,
	// counted and reported by Healthy.
	watch *pgsql.Watch
}

// NewDispatcher returns a Dispatcher of ledger's effects (its schema, its
// Propagator, which puts each effect's stored trace context into the
// context of its provider call) for the given providers, keyed by effect
// kind. Effects of other kinds are left alone (another process may
// dispatch them). db is typically a *pgxpool.Pool.
func NewDispatcher(db oncekit.DB, ledger *Ledger, providers map[string]Provider, cfg *DispatcherConfig) (*Dispatcher, error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	if db == nil {
		return nil, fmt.Errorf("%w: NewDispatcher: db is nil", ErrInvalidConfig)
	}
	if ledger == nil {
		return nil, fmt.Errorf("%w: NewDispatcher: ledger is nil", ErrInvalidConfig)
	}
	if len(providers) == 0 {
		return nil, fmt.Errorf("%w: NewDispatcher: no providers", ErrInvalidConfig)
	}
	m, err := newMetrics(c.Registerer)
	if err != nil {
		return nil, fmt.Errorf("sideeffect: DispatcherConfig.Registerer: %w", err)
	}
	d := &Dispatcher{db: db, ledger: ledger, cfg: c, log: c.Logger.With("dispatcher", c.ID), sql: ledger.sql, m: m,
		caps: map[string]*capabilities{}, wake: make(chan struct{}, 1),
		minClaim: max(int64(1), int64(min(c.Concurrency, c.BatchSize))/2), maxClaim: 5 * int64(c.BatchSize)}
	d.claimSize.Store(int64(c.BatchSize))
	d.watch = pgsql.NewWatch(d.log, func(statement, class string) {
		m.statementErrors.WithLabelValues(statement, class).Inc()
	})
	for kind, p := range providers {
		if kind == "" || len(kind) > MaxKindLen {
			return nil, fmt.Errorf("sideeffect: NewDispatcher: invalid kind %q", kind)
		}
		if p == nil {
			return nil, fmt.Errorf("sideeffect: NewDispatcher: nil provider for kind %q", kind)
		}
		cp := capabilitiesOf(p, c.CallTimeout)
		cp.m = m.forKind(kind)
		d.caps[kind] = &cp
		d.kinds = append(d.kinds, kind)
		switch {
		case cp.honoursKeys:
			d.refire = append(d.refire, kind)
		case cp.looker != nil:
			d.lookup = append(d.lookup, kind)
		default:
			d.unknown = append(d.unknown, kind)
		}
	}
	for _, s := range [][]string{d.kinds, d.refire, d.lookup, d.unknown} {
		sort.Strings(s)
	}
	return d, nil
}

// ID returns the dispatcher's lease owner name.
func (d *Dispatcher) ID() string { return d.cfg.ID }

// Healthy reports nil when the database answers and the last round of
// claims and outcome commits worked. While a statement of the dispatcher
// fails in a way that sending it again cannot cure (a missing grant, a
// table or column that is not there, a read-only server), its error names
// the statement, since when it fails and PostgreSQL's answer, and wraps
// oncekit.ErrStatementBroken; such failures are logged at error level once
// per cause and minute and counted in
// oncekit_sideeffect_statement_errors_total.
func (d *Dispatcher) Healthy(ctx context.Context) error {
	if err := d.watch.Err(); err != nil {
		return err
	}
	var one int
	if err := d.db.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	if p := d.lastErr.Load(); p != nil && *p != nil {
		return *p
	}
	return nil
}

// job is a claimed row to call (or, for lookup, to reconcile).
type job struct {
	call   Call
	caps   *capabilities
	lookup bool
	// startBy is the latest time the call may start and still end (bounded
	// by CallTimeout) well before the lease expires; a job that waited
	// longer in the queue is put back instead of called, so a row is never
	// called by two dispatchers at once.
	startBy time.Time
}

// capacity is how many claimed rows may wait for or be in a call: enough
// to keep every worker busy during a claim round trip, with claims large
// enough that one commit covers many rows.
func (d *Dispatcher) capacity() int64 { return int64(2*d.cfg.Concurrency) + d.claimSize.Load() }

// sizeClaims sets the claim size for a round that commits k outcomes: the
// calls that finished since the last round. Claims of 4k rows keep the
// callers busy until the next round's claims arrive, although a larger claim
// makes its round longer (measured: 2k left the machine 15% idle, 4k 5%); a
// row then waits about four rounds for its call, far inside its lease.
// BatchSize is the floor, so a slow provider never gets a longer queue than
// BatchSize allows (rows waiting in it count against their leases).
func (d *Dispatcher) sizeClaims(k int) {
	d.claimSize.Store(min(max(4*int64(k), int64(d.cfg.BatchSize)), d.maxClaim))
}

// Run dispatches until ctx ends, then stops claiming, lets the calls in
// progress finish (each bounded by CallTimeout), puts back claimed rows that
// were not called, commits every outcome, and returns nil. It returns an
// error only if it cannot start.
func (d *Dispatcher) Run(ctx context.Context) error {
	if !d.running.CompareAndSwap(false, true) {
		return oncekit.ErrAlreadyRunning
	}
	defer d.running.Store(false)
	d.log.Info("dispatcher started", "kinds", d.kinds, "concurrency", d.cfg.Concurrency, "lease", d.cfg.Lease)

	// Room for every claimed row at the largest claim size, and a claim more.
	room := 2*d.cfg.Concurrency + 2*int(d.maxClaim)
	jobs := make(chan job, room)
	results := make(chan outcome, room)

	// Producers queue jobs: the sync loop (until ctx ends) and recovery.
	var producers, syncing sync.WaitGroup
	producers.Add(2)
	go func() { defer producers.Done(); d.maintainLoop(ctx, jobs) }()
	syncing.Add(1)
	go func() { defer syncing.Done(); d.syncLoop(ctx, jobs, results, producers.Done) }()

	// Calls outlive a shutdown request: an abandoned call is an unknown
	// outcome, while a finished one is recorded.
	callCtx := context.WithoutCancel(ctx)
	deadlines := make(map[*capabilities]*callDeadlines, len(d.caps))
	for _, c := range d.caps {
		deadlines[c] = newCallDeadlines(callCtx, c.timeout)
	}
	var workers sync.WaitGroup
	for range d.cfg.Concurrency {
		workers.Add(1)
		go func() { defer workers.Done(); d.work(ctx, jobs, results, deadlines) }()
	}

	producers.Wait()
	close(jobs)
	workers.Wait()
	for _, dl := range deadlines {
		dl.stop()
	}
	close(results)
	syncing.Wait()
	d.log.Info("dispatcher stopped")
	return nil
}

// setErr records the outcome of the last sync round for Healthy.
func (d *Dispatcher) setErr(err error) {
	if err == nil {
		if p := d.lastErr.Load(); p == nil || *p == nil {
			return
		}
	}
	d.lastErr.Store(&err)
}

func (d *Dispatcher) signal() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// claimTimeout bounds one claiming (or sync) statement.
const claimTimeout = 30 * time.Second

// reserve takes up to the claim size in free slots, at least minN, for a
// claim; the claim gives back what it did not use. It returns 0 when fewer
// are free.
func (d *Dispatcher) reserve(minN int64) int {
	for {
		cur := d.inflight.Load()
		free := d.capacity() - cur
		if free < max(minN, 1) {
			return 0
		}
		n := min(free, d.claimSize.Load())
		if d.inflight.CompareAndSwap(cur, cur+n) {
			return int(n)
		}
	}
}

// startBy is the latest start of a call for a row claimed now (measured
// before the lease starts).
func (d *Dispatcher) startBy() time.Time {
	slack := d.cfg.Lease - d.cfg.CallTimeout
	return time.Now().Add(slack - slack/4)
}

// claim runs one recovery statement (refire or reconcile) for n reserved
// slots and queues the rows it returns, giving back the slots it did not
// fill. Slots given back wake the sync loop: it may have found too few free
// slots to claim while recovery held them, and finished calls, its only
// other wake, may all be over (recovery usually finds no expired lease).
func (d *Dispatcher) claim(ctx context.Context, query string, kinds []string, n int, lookup bool, jobs chan<- job) (got int, err error) {
	defer func() {
		d.inflight.Add(int64(got - n))
		if got < n {
			d.signal()
		}
	}()
	if len(kinds) == 0 || n <= 0 {
		return 0, nil
	}
	startBy := d.startBy()
	// A claim is not cancelled half-way by shutdown: its outcome would be
	// ambiguous (rows fired but never queued). Rows it returns after ctx
	// ended are put back by the workers.
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	defer cancel()
	claimed := make([]job, 0, n) // sized once: a job is ~150 bytes, regrowing copied each about twice
	err = d.exec(qctx, query, []any{d.cfg.ID, d.cfg.Lease, kinds, n}, func(rows pgx.Rows) error {
		for rows.Next() {
			var j job
			c := &j.call
			if err := rows.Scan(&c.ID, &c.SourceID, &c.Kind, &c.Payload, &c.Key, &c.Attempt, &c.RecordedAt, &c.Trace); err != nil {
				return err
			}
			j.caps, j.lookup, j.startBy = d.caps[c.Kind], lookup, startBy
			claimed = append(claimed, j)
		}
		return rows.Err()
	})
	if err != nil {
		// The statement did not commit (or its outcome is unknown): no row
		// is called. Rows it did fire are recovered when their lease expires.
		return 0, fmt.Errorf("sideeffect: claim: %w", err)
	}
	return handOut(claimed, !lookup, jobs), nil
}

// handOut queues committed claims for the callers and returns how many.
// Rows the claim fired are counted first and pass the after-fired crash
// point: committed, not yet called.
func handOut(claimed []job, fired bool, jobs chan<- job) int {
	if len(claimed) == 0 {
		return 0
	}
	if fired {
		for _, j := range claimed {
			j.caps.m.fired.Inc()
		}
		crashpoint.Hit("sideeffect.after-fired")
	}
	for _, j := range claimed {
		jobs <- j
	}
	return len(claimed)
}

// work calls providers for queued jobs, each call bounded by a context of
// deadlines (never cancelled by ctx: see Run).
func (d *Dispatcher) work(ctx context.Context, jobs <-chan job, results chan<- outcome, deadlines map[*capabilities]*callDeadlines) {
	for j := range jobs {
		var o outcome
		switch {
		case ctx.Err() != nil:
			o = d.release(j) // stopping: never start a call
		case time.Now().After(j.startBy):
			// Calls are slower than the lease allows for the queue: the row goes
			// back, due again after MinBackoff (a hint to raise Concurrency or
			// Lease, or lower BatchSize).
			d.log.Warn("claimed effect waited too long to be called within its lease; put back", "id", j.call.ID, "kind", j.call.Kind)
			o = d.release(j)
			o.delay = d.cfg.MinBackoff
		default:
			o = d.do(deadlines[j.caps].context(), j)
		}
		// Wake the sync loop only when it can claim: a wake per finished call
		// cost a goroutine switch per effect for nothing.
		if left := d.inflight.Add(-1); left == 0 || d.capacity()-left >= d.minClaim {
			d.signal()
		}
		results <- o
	}
}
