package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/cfgerr"
	"github.com/oncekit/oncekit/internal/nodeid"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/retention"
)

// RelayConfig configures a Relay. The zero value works.
type RelayConfig struct {
	// ID names this relay process in the lease tables: valid UTF-8
	// without control characters, at most 255 bytes. Defaults to
	// hostname-pid-random.
	ID string
	// BatchSize is the most rows read and published at once per partition.
	// Defaults to 1000.
	BatchSize int
	// Lease is how long a partition lease lasts without renewal; leases are
	// renewed every Lease/3, and a relay stops publishing a partition
	// Lease/5 before its lease would expire unrenewed. Defaults to 10s.
	Lease time.Duration
	// PollInterval is the longest wait between two looks at the outbox: the
	// fallback when no notification arrives, and the idle polling period.
	// Defaults to 500ms.
	PollInterval time.Duration
	// BusyPollInterval is the wait between two looks while events keep
	// arriving; the wait doubles on each empty look up to PollInterval.
	// Defaults to 1ms.
	BusyPollInterval time.Duration
	// PollOnly disables LISTEN. Defaults to false: the relay listens for
	// writers' and the CLI's notifications when its pool connects to
	// PostgreSQL directly, and polls (saying so once at start) when a
	// connection pooler sits between them (PgBouncer in transaction mode,
	// Supavisor), where a LISTEN is lost with its transaction.
	PollOnly bool
	// PublishTimeout bounds one publish round to the broker. Defaults to 30s.
	PublishTimeout time.Duration
	// MaxAttempts is the number of failed publishes after which a message is
	// parked. Attempts are counted only while the broker is reachable (a
	// broker outage parks nothing). Defaults to 10.
	MaxAttempts int
	// MinBackoff and MaxBackoff bound the exponential wait before a failed
	// message is tried again. Default to 1s and 5m.
	MinBackoff, MaxBackoff time.Duration
	// MaxBrokerBackoff caps the exponential backoff of a partition while the
	// broker is unreachable. Defaults to 10s.
	MaxBrokerBackoff time.Duration
	// Retention is how long published messages stay in the outbox, counted
	// from their Enqueue, before the retention loop deletes them; until then
	// Enqueue reports their IDs as duplicates. Defaults to 24h; negative
	// disables the loop.
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
	// StatsInterval is the period at which the gauges (oldest unpublished age,
	// parked) are refreshed. Defaults to 5s.
	StatsInterval time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the relay's metrics. Nil means no metrics.
	Registerer prometheus.Registerer
}

// Relay publishes committed outbox rows to a broker. See the package doc.
type Relay struct {
	pool oncekit.Pool
	pub  broker.Publisher
	cfg  RelayConfig
	sql  relaySQL
	log  *slog.Logger
	m    *metrics
	ch   string
	// watch makes the statements of the loops that cannot succeed as sent
	// errors, counted and reported by Healthy.
	watch *pgsql.Watch
	// syncStandbys says whether batches must wait for the synchronous
	// standbys before they are published (see fetch).
	syncStandbys pgsql.SyncStandbys

	epoch   time.Time
	probeCh chan struct{}
	running atomic.Bool
	// fatal ends Run with its cause (a *ClusterMovedError) while it runs.
	fatal atomic.Pointer[context.CancelCauseFunc]

	ob *Outbox // its schema
	// parts is the partition count the relay serves: the rows of
	// relay_partitions, read at start and on every lease round.
	parts atomic.Int32
	bar   barrier

	mu      sync.Mutex
	workers map[int]*worker
	bg      sync.WaitGroup // partition releases in progress

	// drained wakes the stats loop when a partition drained while
	// backlogShown (the gauges showed a backlog at their last refresh).
	drained      chan struct{}
	backlogShown atomic.Bool
}

// NewRelay returns a relay publishing ob's outbox (its schema) from pool
// with pub. pool is normally a *pgxpool.Pool allowing about the partition
// count + 4 connections.
func NewRelay(pool oncekit.Pool, ob *Outbox, pub broker.Publisher, cfg *RelayConfig) (*Relay, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: NewRelay: pool is nil", ErrInvalidConfig)
	}
	if ob == nil {
		return nil, fmt.Errorf("%w: NewRelay: outbox is nil", ErrInvalidConfig)
	}
	if pub == nil {
		return nil, fmt.Errorf("%w: NewRelay: publisher is nil", ErrInvalidConfig)
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	schema := ob.schema
	m, err := newMetrics(c.Registerer)
	if err != nil {
		return nil, err
	}
	log := c.Logger.With("component", "outbox.relay", "node", c.ID)
	return &Relay{
		watch: pgsql.NewWatch(log, func(statement, class string) {
			m.statementErrors.WithLabelValues(statement, class).Inc()
		}),
		pool:    pool,
		ob:      ob,
		pub:     pub,
		cfg:     c,
		sql:     renderRelaySQL(schema),
		log:     log,
		m:       m,
		ch:      NotifyChannel(schema),
		epoch:   time.Now(),
		drained: make(chan struct{}, 1),
		probeCh: make(chan struct{}, 1),
		workers: map[int]*worker{},
		bar:     newBarrier(),
	}, nil
}

// withDefaults returns a copy of c (the zero RelayConfig if nil) with
// defaults set.
func (c *RelayConfig) withDefaults() RelayConfig {
	out := cfgerr.CopyOf(c)
	if out.ID == "" {
		out.ID = nodeid.New()
	}
	out.BatchSize = cmp.Or(out.BatchSize, 1000)
	out.Lease = cmp.Or(out.Lease, 10*time.Second)
	out.PollInterval = cmp.Or(out.PollInterval, 500*time.Millisecond)
	out.BusyPollInterval = cmp.Or(out.BusyPollInterval, time.Millisecond)
	out.PublishTimeout = cmp.Or(out.PublishTimeout, 30*time.Second)
	out.MaxAttempts = cmp.Or(out.MaxAttempts, 10)
	out.MinBackoff = cmp.Or(out.MinBackoff, time.Second)
	out.MaxBackoff = cmp.Or(out.MaxBackoff, 5*time.Minute)
	out.MaxBrokerBackoff = cmp.Or(out.MaxBrokerBackoff, 10*time.Second)
	out.Retention = cmp.Or(out.Retention, 24*time.Hour)
	retention.Defaults(&out.RetentionInterval, &out.RetentionBatch, &out.RetentionRate)
	out.StatsInterval = cmp.Or(out.StatsInterval, 5*time.Second)
	out.Logger = cmp.Or(out.Logger, slog.Default())
	return out
}

// Validate returns the error NewRelay would return for c (nil: the zero
// RelayConfig), naming its first bad field and wrapping ErrInvalidConfig:
// for a caller that checks a configuration before it has a pool, such as
// the template of a relay fleet's relays.
func (c *RelayConfig) Validate() error {
	d := c.withDefaults()
	return d.validate()
}

// validate returns an error naming the first bad field, wrapping
// ErrInvalidConfig.
func (c *RelayConfig) validate() error {
	bad := cfgerr.For(ErrInvalidConfig, "outbox: RelayConfig")
	if err := bad.IfNegative(c, "BatchSize", "PollInterval", "BusyPollInterval",
		"PublishTimeout", "MaxAttempts", "MinBackoff", "MaxBrokerBackoff", "StatsInterval",
		"RetentionInterval", "RetentionBatch"); err != nil {
		return err
	}
	if err := bad.IfNotID(c, "ID"); err != nil {
		return err
	}
	switch {
	case c.Lease < 300*time.Millisecond:
		return bad("Lease", "%v is below 300ms", c.Lease)
	case c.BusyPollInterval > c.PollInterval:
		return bad("BusyPollInterval", "%v is above PollInterval (%v)", c.BusyPollInterval, c.PollInterval)
	case c.MaxBackoff < c.MinBackoff:
		return bad("MaxBackoff", "%v is below MinBackoff (%v)", c.MaxBackoff, c.MinBackoff)
	}
	return nil
}

// Run publishes until ctx ends, then finishes the batches in flight, releases
// its leases and returns nil. It returns an error when it cannot start
// (PostgreSQL unreachable, a partition mismatch), and a *ClusterMovedError
// (ErrClusterMoved) when the outbox is ahead of its server: at start, or
// later when it acquires a partition or renews its leases (the database was
// swapped under it), in which case it stops as on ctx's end first.
// Otherwise it retries failures of PostgreSQL and of the broker with
// backoff. Called while another Run of r has not returned, it returns
// oncekit.ErrAlreadyRunning.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return oncekit.ErrAlreadyRunning
	}
	defer r.running.Store(false)
	if err := r.setup(ctx); err != nil {
		return err
	}
	listen, err := r.listens(ctx)
	if err != nil {
		return err
	}
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	r.fatal.Store(&stop)
	defer r.fatal.Store(nil)
	r.log.Info("relay started", "partitions", r.parts.Load(), "batch", r.cfg.BatchSize, "poll_only", !listen)
	var wg sync.WaitGroup
	loops := []func(context.Context){r.probeLoop, r.pruneLoop, r.statsLoop, r.barrierLoop}
	if listen {
		loops = append(loops, r.listenLoop)
	}
	for _, loop := range loops {
		wg.Add(1)
		go func() { defer wg.Done(); loop(ctx) }()
	}
	r.leaseLoop(ctx) // returns when ctx ends
	wg.Wait()
	r.shutdown(context.WithoutCancel(ctx))
	if err := context.Cause(ctx); errors.Is(err, ErrClusterMoved) {
		r.log.Error("relay stopped", "err", err)
		return err
	}
	r.log.Info("relay stopped")
	return nil
}

// setup reads the partition count and checks that no partition is ahead
// of the server.
func (r *Relay) setup(ctx context.Context) error {
	n, err := r.partitionCount(ctx)
	if err != nil {
		return err
	}
	return r.checkMoved(ctx, allPartitions(n))
}

// partitionCount reads the partition count the relay serves: the rows of
// relay_partitions, the writers' count and, while a repartition that shrank
// it has not retired them, the partitions beyond.
func (r *Relay) partitionCount(ctx context.Context) (int, error) {
	var n int32
	if err := r.pool.QueryRow(ctx, r.sql.relayPartitions).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: read the partition count: %w", err)
	}
	if n < 1 {
		return 0, errors.New("outbox: relay_partitions is empty: run the migrations")
	}
	r.parts.Store(n)
	return int(n), nil
}

// shutdown stops every worker after its batch, releases the leases and
// removes this node.
func (r *Relay) shutdown(ctx context.Context) {
	r.mu.Lock()
	ws := make([]*worker, 0, len(r.workers))
	for _, w := range r.workers {
		w.signalStop()
		ws = append(ws, w)
	}
	r.mu.Unlock()
	for _, w := range ws {
		<-w.done
	}
	r.bg.Wait()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	parts := make([]int32, 0, len(ws))
	for _, w := range ws {
		parts = append(parts, int32(w.part))
	}
	if _, err := r.pool.Exec(ctx, r.sql.release, r.cfg.ID, parts); err != nil {
		r.log.Warn("releasing leases failed; they expire on their own", "err", err)
	}
	if _, err := r.pool.Exec(ctx, r.sql.removeNode, r.cfg.ID); err != nil {
		r.log.Warn("removing node failed", "err", err)
	}
	r.m.setOwned(0)
	r.mu.Lock()
	clear(r.workers) // all stopped: a later Run starts with no partition
	r.mu.Unlock()
}

// since is the relay's monotonic clock.
func (r *Relay) since() time.Duration { return time.Since(r.epoch) }
