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
	members  []string            // the list in force (see adopt)
	pending  []string            // a different list, seen since pendingSince
	// pendingSince is when pending was first seen, changingSince when the
	// lists began to differ from members (zero while they agree).
	pendingSince, changingSince time.Time

	// Failures of the looks' two NATS calls, logged once a stretch; only
	// Run's goroutine uses them.
	refreshing, listing stretch
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
	defer mem.close()
	if err := mem.refresh(ctx); err != nil {
		return fmt.Errorf("fleet: join: %w", err)
	}
	f.log.Info("fleet member started", "replicas", f.cfg.Replicas, "bucket", f.cfg.Bucket)
	// A look every MemberTTL/3 from the start of the last, however long
	// it took: the entry's refreshes keep their pace.
	every := f.cfg.MemberTTL / 3
	for {
		began := time.Now()
		f.look(ctx, mem)
		if !f.waitChange(ctx, every-time.Since(began)) {
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
	switch err := mem.refresh(ctx); {
	case err != nil && ctx.Err() == nil:
		f.refreshing.failed(f.log, "refreshing the fleet entry failed; retrying at each look", err)
	case err == nil:
		f.refreshing.ok(f.log, "refreshing the fleet entry works again")
	}
	ids, err := mem.list(ctx)
	switch {
	case err != nil && ctx.Err() == nil:
		f.listing.failed(f.log, "reading the fleet members failed; keeping the last list", err)
	case err == nil:
		f.listing.ok(f.log, "reading the fleet members works again")
		f.mu.Lock()
		if f.adopt(ids, time.Now()) {
			f.log.Info("fleet members changed", "members", len(ids))
		}
		f.mu.Unlock()
	}
	f.mu.Lock()
	ms := mem.spread(f.members)
	want := map[string]Database{}
	for name, d := range f.dbs {
		if slices.Contains(AssignSpread(name, ms, f.cfg.Replicas), f.cfg.ID) {
			want[name] = d
		}
	}
	f.mu.Unlock()
	f.m.members.Set(float64(len(ms)))
	f.reconcile(ctx, want)
}

// adopt makes ids the list in force once it has stood for a look (a third
// of MemberTTL): a member that misses one refresh, or a fleet whose
// members are all starting at once, moves no database until the list is
// seen twice, each move being a relay stopped and another started. While
// the lists keep changing, the latest is adopted after a MemberTTL. It
// reports whether the list in force changed; f.mu is held.
func (f *Fleet) adopt(ids []string, now time.Time) bool {
	if slices.Equal(ids, f.members) {
		f.pending, f.changingSince = nil, time.Time{}
		return false
	}
	if f.changingSince.IsZero() {
		f.changingSince = now
	}
	if f.pending == nil || !slices.Equal(ids, f.pending) {
		f.pending, f.pendingSince = ids, now
	}
	if now.Sub(f.pendingSince) < f.cfg.MemberTTL/3 && now.Sub(f.changingSince) < f.cfg.MemberTTL {
		return false
	}
	f.members, f.pending, f.changingSince = ids, nil, time.Time{}
	return true
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

// stretch is a run of failures of one call made at every look (three a
// MemberTTL): the first is logged, with its error, and the end of the run
// with its length, not every look in between.
type stretch struct {
	since time.Time // the first failure; zero while the call works
	looks int       // failed looks since
}

func (s *stretch) failed(log *slog.Logger, msg string, err error) {
	if s.looks == 0 {
		s.since = time.Now()
		log.Warn(msg, "err", err)
	}
	s.looks++
}

func (s *stretch) ok(log *slog.Logger, msg string) {
	if s.looks > 0 {
		log.Info(msg, "failed_looks", s.looks, "for", time.Since(s.since).Round(time.Millisecond))
	}
	*s = stretch{}
}
