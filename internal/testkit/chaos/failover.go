package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
	"github.com/oncekit/oncekit/internal/wait"
)

// FailoverModes are the replications a run can fail over with
// (Options.Failover): "sync", where the primary's commits wait for the
// standby (synchronous_standby_names, synchronous_commit = on) and only a
// standby in sync is promoted; "async", where they do not, and a failover
// loses what the standby had not received.
var FailoverModes = []string{"sync", "async"}

// syncSettings make every commit wait until the standby flushed it. They
// name the standby by its application_name (pg_basebackup's default, or
// the physical slot's name with failover slots), as a production set-up
// names its standbys.
const syncSettings = `
synchronous_standby_names = 'FIRST 1 (walreceiver, oncekit_standby)'
`

// FailoverRecord is one failover as the run measured it.
type FailoverRecord struct {
	At time.Time
	// Cut is how long the standby had been cut off from the primary when
	// the primary was killed: the replication lag at the failover, in
	// time. Behind is the same in WAL: how much the old primary had
	// written past what the standby received, in bytes. FlushLag is the
	// primary's last measure of the standby's delay before the cut
	// (pg_stat_replication).
	Cut      time.Duration
	Behind   int64
	FlushLag time.Duration
	// Down is the time from the kill to the address pointing at the
	// promoted standby; Rebuilt the time from then until a new standby
	// streamed (and, in sync mode, was in sync again: until then, commits
	// wait).
	Down, Rebuilt time.Duration
	// Promoted is when the address moved to the promoted standby, and
	// Recovered, per daemon (api, relay, consume, dispatch), how long
	// after it that daemon's first work landed: an acknowledged request,
	// an event in the stream, a ledger entry, a call to the provider.
	Promoted  time.Time
	Recovered map[string]time.Duration
}

// daemons are the roles whose recovery a failover measures, in the
// chain's order.
var daemons = []string{"api", "relay", "consume", "dispatch"}

// measureRecovery fills each record's Recovered from what the run saw:
// the operations' answers, the stream's timestamps (of the payments'
// events), the ledger entries' (their transaction's start) and the
// provider's times.
func measureRecovery(recs []FailoverRecord, ops []Op, stream []StreamEvent, applied []time.Time, calls []ProviderCall) {
	firstAfter := func(t time.Time, times func(yield func(time.Time) bool)) time.Duration {
		var first time.Time
		for at := range times {
			if at.After(t) && (first.IsZero() || at.Before(first)) {
				first = at
			}
		}
		if first.IsZero() {
			return -1
		}
		return first.Sub(t)
	}
	payments := map[string]bool{} // the payments' events, not the hostile messages
	for _, op := range ops {
		payments[oncekit.DeriveID(oncekit.DeriveID(apiCaller, op.Key).String(), "PaymentCreated").String()] = true
	}
	for i := range recs {
		p := recs[i].Promoted
		recs[i].Recovered = map[string]time.Duration{
			"api": firstAfter(p, func(yield func(time.Time) bool) {
				for _, op := range ops {
					if op.Outcome == OK && !yield(op.End) {
						return
					}
				}
			}),
			"relay": firstAfter(p, func(yield func(time.Time) bool) {
				for _, e := range stream {
					if payments[e.EventID] && !yield(e.At) {
						return
					}
				}
			}),
			"consume": firstAfter(p, func(yield func(time.Time) bool) {
				for _, at := range applied {
					if !yield(at) {
						return
					}
				}
			}),
			"dispatch": firstAfter(p, func(yield func(time.Time) bool) {
				for _, c := range calls {
					if !yield(c.At) {
						return
					}
				}
			}),
		}
	}
}

// recoverySummary prints, per daemon, the longest recovery of the run's
// failovers in milliseconds (-1: none seen).
func recoverySummary(recs []FailoverRecord) string {
	var b strings.Builder
	for _, d := range daemons {
		worst := time.Duration(-1)
		for _, r := range recs {
			worst = max(worst, r.Recovered[d])
		}
		fmt.Fprintf(&b, " recover_%s_max_ms=%d", d, worst.Milliseconds())
	}
	return b.String()
}

// Topology is the run's replicated PostgreSQL: a primary, a streaming
// standby, and the addresses (proxies) that follow the primary. The
// standby streams through a link of its own (a proxy), which a failover
// cuts first: the primary goes on alone for a moment (Partition), as when
// the network between two zones fails before the primary's does, then
// dies. In sync mode its commits wait for the standby during that moment;
// in async mode they do not, and the failover loses them.
type Topology struct {
	sync  bool
	slots SlotSync
	// Partition is how long the standby is cut off before the primary
	// dies. Defaults to a second.
	Partition time.Duration
	// BeforeCut, when set, runs just before the standby is cut off, and
	// the function it returns just after: the run pauses its consumers
	// there, so that a backlog of messages meets them while the primary is
	// alone and a claim committed without the standby is acked then.
	BeforeCut func(ctx context.Context) (afterCut func())
	link      *PGProxy
	addrs     []*PGProxy

	mu      sync.Mutex
	primary *pgcluster.Cluster
	standby *pgcluster.Cluster
	records []FailoverRecord
	refused []string
}

// NewTopology makes a standby of primary and waits until it streams (in
// sync, if sync). Addresses are added with Follow.
func NewTopology(ctx context.Context, primary *pgcluster.Cluster, sync bool, slots SlotSync) (*Topology, error) {
	link, err := NewPGProxy(primary.Addr())
	if err != nil {
		return nil, err
	}
	t := &Topology{sync: sync, slots: slots, primary: primary, link: link, Partition: time.Second}
	if err := t.rebuild(ctx); err != nil {
		link.Close()
		return nil, err
	}
	return t, nil
}

// SlotSync has the standby keep copies of the primary's failover slots
// (PostgreSQL 17): it streams through a physical slot named Standby, with
// sync_replication_slots on, and the primary's synchronized_standby_slots
// names that slot, so that logical decoding sends nothing the standby
// lacks.
type SlotSync struct {
	Standby string
}

// Follow makes p one of the addresses that move to the new primary.
func (t *Topology) Follow(p *PGProxy) { t.addrs = append(t.addrs, p) }

// Primary returns the current primary.
func (t *Topology) Primary() *pgcluster.Cluster {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.primary
}

// Records returns the failovers so far, and the ones refused with why.
func (t *Topology) Records() ([]FailoverRecord, []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]FailoverRecord(nil), t.records...), append([]string(nil), t.refused...)
}

// Close stops both servers.
func (t *Topology) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.standby != nil {
		t.standby.Close()
	}
	t.primary.Close()
	t.link.Close()
}

// Keep keeps the primary's data directory for a post-mortem.
func (t *Topology) Keep() string { return t.Primary().Keep() }

// errSlotsNotReady refuses a failover that would lose the logical relay's
// slot: the standby has no ready copy of it.
var errSlotsNotReady = errors.New("the standby's copies of the failover slots are not ready")

// errNotInSync refuses a failover that would lose committed transactions
// the replication promised to keep.
var errNotInSync = errors.New("the standby is not in sync")

// Failover cuts the standby off, kills the primary a Partition later
// (SIGKILL: every server process at once), promotes the standby, moves
// the addresses to it (cutting every connection they held: nothing writes
// to the old primary again) and makes a new standby of it from a base
// backup, which it waits for. In sync mode it refuses, cutting and killing
// nothing, unless the standby streams in sync: a standby that may lack
// acknowledged commits is never promoted.
func (t *Topology) Failover(ctx context.Context) (FailoverRecord, error) {
	t.mu.Lock()
	old, next := t.primary, t.standby
	t.mu.Unlock()
	rec := FailoverRecord{At: time.Now()}
	r, err := old.Replica(ctx)
	switch {
	case errors.Is(err, pgcluster.ErrNoReplica):
		return rec, t.refuse(fmt.Errorf("%w: no standby streams", errNotInSync))
	case err != nil:
		return rec, t.refuse(fmt.Errorf("read the standby's state: %w", err))
	case t.sync && (r.State != "streaming" || r.SyncState != "sync"):
		return rec, t.refuse(fmt.Errorf("%w: %s, %s", errNotInSync, r.State, r.SyncState))
	}
	if t.slots.Standby != "" {
		// As a failover manager checking failover slots would: wait a
		// little for the copies, then refuse.
		if why := waitSlotsReady(ctx, old, next, 20*time.Second); why != "" {
			return rec, t.refuse(fmt.Errorf("%w: %s", errSlotsNotReady, why))
		}
	}
	rec.FlushLag = r.FlushLag
	afterCut := func() {}
	if t.BeforeCut != nil {
		afterCut = t.BeforeCut(ctx)
	}
	t.link.Retarget(unreachable)
	cut := time.Now()
	afterCut()
	wait.Sleep(ctx, t.Partition)
	written, err := old.CurrentLSN(ctx)
	if err != nil {
		return rec, err
	}
	rec.Cut = time.Since(cut)
	if err := old.Kill(); err != nil {
		return rec, err
	}
	if received, _, err := next.ReceivedLSN(ctx); err == nil {
		rec.Behind = lsnDiff(written, received)
	}
	if err := next.Promote(ctx); err != nil {
		return rec, err
	}
	for _, a := range append(t.addrs, t.link) {
		a.Retarget(next.Addr())
	}
	rec.Promoted = time.Now()
	rec.Down = rec.Promoted.Sub(cut)
	t.mu.Lock()
	t.primary, t.standby = next, nil
	t.mu.Unlock()
	old.Close()
	start := time.Now()
	if err := t.rebuild(ctx); err != nil {
		return rec, err
	}
	rec.Rebuilt = time.Since(start)
	t.mu.Lock()
	t.records = append(t.records, rec)
	t.mu.Unlock()
	return rec, nil
}

func (t *Topology) refuse(err error) error {
	t.mu.Lock()
	t.refused = append(t.refused, err.Error())
	t.mu.Unlock()
	return fmt.Errorf("failover refused: %w", err)
}

// rebuild makes a standby of the primary and waits until it streams, and
// in sync mode until it is the synchronous one.
func (t *Topology) rebuild(ctx context.Context) error {
	primary := t.Primary()
	var s *pgcluster.Cluster
	var err error
	if t.slots.Standby != "" {
		s, err = primary.FailoverStandbyVia(ctx, t.slots.Standby, t.link.Addr())
	} else {
		s, err = primary.StandbyVia(ctx, t.link.Addr())
	}
	if err != nil {
		return fmt.Errorf("make a standby: %w", err)
	}
	t.mu.Lock()
	t.standby = s
	t.mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err = wait.Until(wctx, 100*time.Millisecond, func(ctx context.Context) error {
		r, err := primary.Replica(ctx)
		switch {
		case err != nil:
			return err
		case r.State != "streaming":
			return fmt.Errorf("standby %s", r.State)
		case t.sync && r.SyncState != "sync":
			return fmt.Errorf("standby %s", r.SyncState)
		}
		return nil
	})
	if err != nil || t.slots.Standby == "" {
		return err
	}
	// A new standby copies a failover slot only once the slot's position on
	// the primary has passed the standby's base backup; a running-xacts
	// record lets it move. Waiting here is best effort: Failover checks
	// again, and refuses while the copies are not ready.
	waitSlotsReady(ctx, primary, s, time.Minute)
	return nil
}

// waitSlotsReady waits up to d for standby's copies of primary's failover
// slots, logging a running-xacts record on the primary each time (the
// slots' positions move on at one), and returns why they are not ready,
// or "".
func waitSlotsReady(ctx context.Context, primary, standby *pgcluster.Cluster, d time.Duration) (why string) {
	sctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	_ = wait.Until(sctx, 250*time.Millisecond, func(ctx context.Context) error {
		_ = primary.Exec(ctx, `SELECT pg_log_standby_snapshot()`)
		var ready bool
		if ready, why = slotsReady(ctx, primary, standby); !ready {
			return errors.New(why)
		}
		return nil
	})
	return why
}

// slotsReady reports whether standby holds a ready copy of each of
// primary's failover slots (synced, not temporary, not invalidated), and
// if not, why.
func slotsReady(ctx context.Context, primary, standby *pgcluster.Cluster) (bool, string) {
	var want []string
	if err := primary.QueryStrings(ctx, `SELECT slot_name FROM pg_replication_slots WHERE failover`, &want); err != nil {
		return false, err.Error()
	}
	var ready []string
	if err := standby.QueryStrings(ctx, `SELECT slot_name FROM pg_replication_slots
		WHERE synced AND NOT temporary AND invalidation_reason IS NULL`, &ready); err != nil {
		return false, err.Error()
	}
	for _, w := range want {
		if !slices.Contains(ready, w) {
			return false, fmt.Sprintf("no ready copy of slot %q", w)
		}
	}
	return true, ""
}

// failoverLoop fails the database over at every quarter of the run (at
// least every 30 s, counted from its start): three or more failovers a
// run. Each runs to its end
// (a new standby streaming) even when the run's time is up.
func failoverLoop(ctx context.Context, t *Topology, d time.Duration, logf func(string, ...any)) int {
	every := min(d/4, 30*time.Second)
	if t.slots.Standby != "" {
		// A failover slot's copy becomes ready once the slot's position
		// moves past what the standby started from, at a running-xacts
		// record: the background writer logs one every 15 s on an active
		// server; the run logs one a second, so that a new standby's copy
		// is ready within seconds and a two-minute run fails over often.
		go func() {
			for wait.Sleep(ctx, time.Second) {
				_ = t.Primary().Exec(ctx, `SELECT pg_log_standby_snapshot()`)
			}
		}()
	}
	start, n := time.Now(), 0
	next := start.Add(every)
	for wait.Sleep(ctx, time.Until(next)) {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
		rec, err := t.Failover(fctx)
		cancel()
		if err != nil {
			logf("failover: %v", err)
			// Refused: try again soon rather than a quarter later.
			next = time.Now().Add(5 * time.Second)
			continue
		}
		next = next.Add(every)
		n++
		logf("failover %d: standby cut off for %s, then the primary SIGKILLed %d bytes of WAL ahead of it (flush lag before the cut %s); promoted standby serving %s after the cut, new standby in %s",
			n, rec.Cut.Round(time.Millisecond), rec.Behind, rec.FlushLag, rec.Down.Round(time.Millisecond), rec.Rebuilt.Round(time.Millisecond))
	}
	return n
}

// unreachable is an address nothing listens on: a proxy pointed there
// refuses every connection, a partition.
const unreachable = "127.0.0.1:1"

// lsnDiff returns a - b in bytes, for WAL positions written as X/Y, and 0
// when b is not behind a or either does not parse.
func lsnDiff(a, b string) int64 {
	pa, oka := parseLSN(a)
	pb, okb := parseLSN(b)
	if !oka || !okb || pb >= pa {
		return 0
	}
	return int64(pa - pb)
}

func parseLSN(s string) (uint64, bool) {
	var hi, lo uint32
	if _, err := fmt.Sscanf(s, "%X/%X", &hi, &lo); err != nil {
		return 0, false
	}
	return uint64(hi)<<32 | uint64(lo), true
}

// lagSummary prints the failovers' measured lag: in WAL, the most the
// standby was behind at a kill and the sum over the run; in time, the
// longest cut.
func lagSummary(recs []FailoverRecord) string {
	var maxBehind, sumBehind int64
	var maxCut time.Duration
	for _, r := range recs {
		maxBehind = max(maxBehind, r.Behind)
		sumBehind += r.Behind
		maxCut = max(maxCut, r.Cut)
	}
	return fmt.Sprintf("failover_behind_max_bytes=%d failover_behind_sum_bytes=%d failover_cut_max_ms=%d", maxBehind, sumBehind, maxCut.Milliseconds())
}
