package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
)

// Fleet is one member of a relay fleet. See the package doc.
type Fleet struct {
	js  jetstream.JetStream
	pub broker.Publisher
	cfg Config
	log *slog.Logger
	m   *metrics

	running atomic.Bool
	changed chan struct{} // Set wakes the assignment loop

	mu       sync.Mutex
	dbs      map[string]Database // the configured set, by name
	runners  map[string]*runner  // the databases served now, by name
	stopping map[string]*runner  // runners stopped and not yet done
	members  []string            // at the last look
}

// New returns a fleet member that finds the others through js's key-value
// store and publishes with pub. It serves nothing until Set gives it
// databases and Run runs.
func New(js jetstream.JetStream, pub broker.Publisher, cfg *Config) (*Fleet, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: New: jetstream is nil", ErrInvalidConfig)
	}
	if pub == nil {
		return nil, fmt.Errorf("%w: New: publisher is nil", ErrInvalidConfig)
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	if err := c.Relay.Validate(); err != nil {
		return nil, fmt.Errorf("%w: the relays' template: %w", ErrInvalidConfig, err)
	}
	m, err := newMetrics(c.Registerer)
	if err != nil {
		return nil, err
	}
	return &Fleet{
		js: js, pub: pub, cfg: c, m: m,
		log:      c.Logger.With("component", "outbox.fleet", "node", c.ID),
		changed:  make(chan struct{}, 1),
		dbs:      map[string]Database{},
		runners:  map[string]*runner{},
		stopping: map[string]*runner{},
	}, nil
}

// Set replaces the set of databases the fleet serves. Databases added are
// served (by the members they are assigned to) at once, those removed
// stop being served (their relays finish their batches and give their
// leases back), and those whose URL or schema changed restart; the others
// go on untouched. A bad list (a bad name, an empty URL, a name or an
// outbox listed twice) is refused whole with an error wrapping
// ErrInvalidConfig, and the set in force stays. Every member must be given
// the same set: a database one member lacks is served by fewer than k.
func (f *Fleet) Set(dbs []Database) error {
	if err := checkDatabases(dbs); err != nil {
		return err
	}
	next := make(map[string]Database, len(dbs))
	for _, d := range dbs {
		next[d.Name] = d
	}
	f.mu.Lock()
	f.dbs = next
	f.mu.Unlock()
	select {
	case f.changed <- struct{}{}:
	default:
	}
	return nil
}

// Databases returns the names of the databases this member serves now,
// sorted.
func (f *Fleet) Databases() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.runners))
}

// Members returns the live members at the last look, sorted.
func (f *Fleet) Members() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.members)
}

// Run joins the fleet and serves the databases assigned to this member
// until ctx ends; then it leaves (its databases move to others at their
// next look), stops its relays (each finishing its batches and giving its
// leases back) and returns nil. It returns an error when it cannot join
// (the bucket cannot be created or written); later NATS failures keep the
// last assignment in force and are retried (the partition leases keep two
// members that both try a database from publishing twice). Called while
// another Run of f has not returned, it returns oncekit.ErrAlreadyRunning.
func (f *Fleet) Run(ctx context.Context) error {
	if !f.running.CompareAndSwap(false, true) {
		return oncekit.ErrAlreadyRunning
	}
	defer f.running.Store(false)
	mem, err := joinBucket(ctx, f.js, &f.cfg)
	if err != nil {
		return err
	}
	if err := mem.refresh(ctx); err != nil {
		return fmt.Errorf("fleet: join: %w", err)
	}
	f.log.Info("fleet member started", "replicas", f.cfg.Replicas, "bucket", f.cfg.Bucket)
	every := f.cfg.MemberTTL / 3
	for {
		f.look(ctx, mem)
		if !f.waitChange(ctx, every) {
			break
		}
	}
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.cfg.ConnectTimeout)
	defer cancel()
	if err := mem.leave(lctx); err != nil {
		f.log.Warn("leaving the fleet failed; the entry expires on its own", "err", err)
	}
	f.reconcile(ctx, nil)
	f.log.Info("fleet member stopped")
	return nil
}

// waitChange waits d or until Set changed the set; false when ctx ended.
func (f *Fleet) waitChange(ctx context.Context, d time.Duration) bool {
	select {
	case <-f.changed:
		return ctx.Err() == nil
	default:
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-f.changed:
		return true
	case <-t.C:
		return true
	}
}

// look refreshes this member's entry, reads the members and serves what
// is assigned to it. On a NATS failure the last member list stays.
func (f *Fleet) look(ctx context.Context, mem *members) {
	if err := mem.refresh(ctx); err != nil && ctx.Err() == nil {
		f.log.Warn("refreshing the fleet entry failed", "err", err)
	}
	ids, err := mem.list(ctx)
	switch {
	case err != nil && ctx.Err() == nil:
		f.log.Warn("reading the fleet members failed; keeping the last list", "err", err)
	case err == nil:
		f.mu.Lock()
		if !slices.Equal(ids, f.members) {
			f.log.Info("fleet members changed", "members", len(ids))
		}
		f.members = ids
		f.mu.Unlock()
	}
	f.mu.Lock()
	ids = f.members
	want := map[string]Database{}
	for name, d := range f.dbs {
		if slices.Contains(Assign(name, ids, f.cfg.Replicas), f.cfg.ID) {
			want[name] = d
		}
	}
	f.mu.Unlock()
	f.m.members.Set(float64(len(ids)))
	f.reconcile(ctx, want)
}

// reconcile starts the runners of want that are not running and stops the
// others; a nil want stops them all and waits for them. Stopping never
// waits for a database otherwise: a slow one delays nothing. A database
// started again while its former runner still stops waits for it (they
// would share its metrics).
func (f *Fleet) reconcile(ctx context.Context, want map[string]Database) {
	f.mu.Lock()
	var stopped []*runner
	for name, r := range f.runners {
		if d, ok := want[name]; ok && d == r.db {
			continue
		}
		r.stop()
		stopped = append(stopped, r)
		delete(f.runners, name)
		f.stopping[name] = r
		go f.stopped(r)
	}
	for name, d := range want {
		if _, ok := f.runners[name]; !ok {
			f.runners[name] = f.startRunner(ctx, d, f.stopping[name])
		}
	}
	f.m.owned.Set(float64(len(f.runners)))
	if want == nil {
		// Those stopped earlier too: Run returns once every relay has.
		for _, r := range f.stopping {
			if !slices.Contains(stopped, r) {
				stopped = append(stopped, r)
			}
		}
	}
	f.mu.Unlock()
	if want == nil {
		for _, r := range stopped {
			<-r.done
		}
	}
}

// stopped waits for r to stop, then forgets it, and its database's series
// when the database left the configured set.
func (f *Fleet) stopped(r *runner) {
	<-r.done
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopping[r.db.Name] == r {
		delete(f.stopping, r.db.Name)
	}
	if _, ok := f.dbs[r.db.Name]; !ok {
		f.m.forget(r.db.Name)
	}
}
