package chaos

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// The invariants of the fleet run, by the names a failed verdict reports.
const (
	InvFleetLost       = "lost"                      // every event a writer committed is in the stream
	InvFleetDuplicates = "duplicates"                // no event stored twice (beyond JetStream's dedup window)
	InvFleetOrder      = "order_violations"          // each ordering key's events in the stream in commit order
	InvFleetReowned    = "reowned_within_lease"      // every partition of every live database owned again within a lease of a kill
	InvFleetIsolation  = "p99_ms_other_while_down"   // a database down slows no other: p99 within 1.5x of the baseline
	InvFleetConns      = "max_server_conns_per_db"   // server connections per database within the budget
	InvFleetMoved      = "leases_moved_per_death"    // a member's death moves about 1/n of the leases
	InvFleetWritten    = "every_database_written_to" // the run did work: each database took events
	// fleetSlowdown is how much slower the other databases may publish
	// while one is down than in the baseline window.
	fleetSlowdown = 1.5
	// fleetMovedSlack bounds leases moved per death to within this factor
	// of 1/n either way: a death moves the leases its members held, which
	// vary with how many databases rendezvous hashing gave them.
	fleetMovedSlack = 2.0
)

// FleetWrite is one event a writer committed, as the writer recorded it in
// the database in the same transaction.
type FleetWrite struct {
	DB, ID, Key string
	Seq         int64
	At          time.Time // clock_timestamp() in the writing transaction
}

// FleetKill is one SIGKILL of a fleet process and what followed.
type FleetKill struct {
	Process string
	At      time.Time
	Members int // members that died with the process
	// Reown is how long after the kill every partition of every live
	// database had an unexpired lease held by a live member; negative if
	// that was not seen before the run gave up waiting.
	Reown time.Duration
	// FirstReown is how long after the kill the last partition was first
	// seen held by a live member (a partition handed over later is
	// unheld again meanwhile); Waiting names the partitions without a
	// live owner at the last look before Reown.
	FirstReown time.Duration
	Waiting    []string
	// Moved and Total count the partition leases (of the live databases)
	// whose owner changed between just before the kill and Reown, and all
	// of them.
	Moved, Total int
}

// Window is a span of commit times.
type Window struct{ From, To time.Time }

func (w Window) holds(t time.Time) bool { return !t.Before(w.From) && t.Before(w.To) }

// FleetObservations is what a fleet run saw; CheckFleet judges it.
type FleetObservations struct {
	Databases []string
	Members   int // fleet members configured (n)
	Written   []FleetWrite
	Stream    []StreamEvent
	// Baselines are windows without faults, Down the window in which
	// DownDB was stopped (the run takes one baseline right before the
	// outage and one right after it, together as long as the outage). The
	// commit-to-publish p99 of the other databases' events (all but
	// DownDB) in Down is compared with that of the baselines' events
	// pooled: the machine's load drifts over a run, and a baseline on one
	// side only measured the outage against whatever that side held.
	Baselines []Window
	Down      Window
	DownDB    string
	Lease     time.Duration
	Kills     []FleetKill
	// MaxConns is the most server connections of the fleet seen per
	// database while no member joined or left; MaxConnsHandover over the
	// whole run.
	MaxConns, MaxConnsHandover map[string]int
	// Budget is k × fleet.Budget(partitions, k, MaxConnsPerDatabase), what
	// a database's k members may hold.
	Budget        int
	NATSNodeKills int
	DBStops       int
	Repartitions  int
}

// FleetVerdict is CheckFleet's judgement.
type FleetVerdict struct {
	Events, Lost, Duplicates, OrderViolations int
	Reowned                                   int // kills after which every partition was owned again within the bound
	MaxReown                                  time.Duration
	P99Baseline, P99OtherDown                 time.Duration
	P99EachBaseline                           []time.Duration // each baseline window's own
	MaxConns, MaxConnsHandover                int
	MovedPerDeath, Expected                   float64
	Examples                                  []string
	violated                                  []string
	obs                                       *FleetObservations
}

// Pass reports whether every invariant held.
func (v *FleetVerdict) Pass() bool { return len(v.violated) == 0 }

// Violated names the invariants that did not hold.
func (v *FleetVerdict) Violated() []string { return slices.Clone(v.violated) }

// ReownBound is how long after a kill the partitions may wait for a new
// owner: the dead members' leases run out at most one Lease after the
// kill, and the survivors take them within one Lease of that.
func ReownBound(lease time.Duration) time.Duration { return 2 * lease }

// CheckFleet judges what a fleet run saw.
func CheckFleet(o *FleetObservations) *FleetVerdict {
	v := &FleetVerdict{obs: o, Events: len(o.Written)}
	fail := func(inv, format string, args ...any) {
		if !slices.Contains(v.violated, inv) {
			v.violated = append(v.violated, inv)
		}
		if len(v.Examples) < 3*maxExamplesPerRule {
			v.Examples = append(v.Examples, inv+": "+fmt.Sprintf(format, args...))
		}
	}
	first := map[string]StreamEvent{}
	lastSeq := map[string]int64{}
	for _, e := range o.Stream {
		if _, seen := first[e.EventID]; seen {
			v.Duplicates++
			fail(InvFleetDuplicates, "event %s stored again at stream seq %d", e.EventID, e.Seq)
			continue
		}
		first[e.EventID] = e
		if prev, ok := lastSeq[e.Key]; ok && e.AccountSeq < prev {
			v.OrderViolations++
			fail(InvFleetOrder, "key %s: seq %d after %d (stream seq %d)", e.Key, e.AccountSeq, prev, e.Seq)
		}
		lastSeq[e.Key] = max(lastSeq[e.Key], e.AccountSeq)
	}
	perDB := map[string]int{}
	var base, down []time.Duration
	each := make([][]time.Duration, len(o.Baselines))
	for _, w := range o.Written {
		perDB[w.DB]++
		e, ok := first[w.ID]
		if !ok {
			v.Lost++
			fail(InvFleetLost, "event %s of %s (key %s, seq %d) committed at %s is not in the stream", w.ID, w.DB, w.Key, w.Seq, w.At.Format("15:04:05.000"))
			continue
		}
		lat := e.At.Sub(w.At)
		if w.DB == o.DownDB { // the same databases in every window
			continue
		}
		if o.Down.holds(w.At) {
			down = append(down, lat)
		}
		for i, b := range o.Baselines {
			if b.holds(w.At) {
				base = append(base, lat)
				each[i] = append(each[i], lat)
			}
		}
	}
	for _, db := range o.Databases {
		if perDB[db] == 0 {
			fail(InvFleetWritten, "no event committed in %s", db)
		}
	}
	v.P99Baseline, v.P99OtherDown = p99(base), p99(down)
	windows := make([]string, len(each))
	for i, b := range each {
		v.P99EachBaseline = append(v.P99EachBaseline, p99(b))
		windows[i] = p99(b).String()
	}
	switch {
	case len(base) == 0 || len(down) == 0:
		fail(InvFleetIsolation, "no events to compare: %d in the baseline window, %d of the others while %s was down", len(base), len(down), o.DownDB)
	case float64(v.P99OtherDown) > fleetSlowdown*float64(v.P99Baseline):
		fail(InvFleetIsolation, "the other databases' p99 %s while %s was down is above %.1f x the baselines' %s (each window's: %s)",
			v.P99OtherDown, o.DownDB, fleetSlowdown, v.P99Baseline, strings.Join(windows, ", "))
	}
	bound := ReownBound(o.Lease)
	var moved float64
	var deaths int
	for _, k := range o.Kills {
		v.MaxReown = max(v.MaxReown, k.Reown)
		if k.Reown >= 0 && k.Reown <= bound {
			v.Reowned++
		} else {
			fail(InvFleetReowned, "after the kill of %s at %s the partitions were owned again after %s (bound %s; negative: never seen)", k.Process, k.At.Format("15:04:05.000"), k.Reown, bound)
		}
		if k.Total > 0 && k.Members > 0 {
			moved += float64(k.Moved) / float64(k.Total)
			deaths += k.Members
		}
	}
	if o.Members > 0 {
		v.Expected = 1 / float64(o.Members)
	}
	if deaths > 0 {
		v.MovedPerDeath = moved / float64(deaths)
		if v.MovedPerDeath > fleetMovedSlack*v.Expected || v.MovedPerDeath < v.Expected/fleetMovedSlack {
			fail(InvFleetMoved, "%.4f of the leases moved per member death, expected about 1/n = %.4f", v.MovedPerDeath, v.Expected)
		}
	}
	for _, db := range slices.Sorted(maps.Keys(o.MaxConns)) {
		n := o.MaxConns[db]
		v.MaxConns = max(v.MaxConns, n)
		if n > o.Budget {
			fail(InvFleetConns, "%s had %d server connections from the fleet, budget %d", db, n, o.Budget)
		}
	}
	// Reported, not held to a bound: right after a NATS node's restart
	// members have listed themselves (nearly) alone for a moment and served
	// every database (docs/proof.md, "Findings").
	for _, n := range o.MaxConnsHandover {
		v.MaxConnsHandover = max(v.MaxConnsHandover, n)
	}
	return v
}

// Line is the run's machine-readable summary line.
func (v *FleetVerdict) Line() string {
	o := v.obs
	verdict := "PASS"
	if !v.Pass() {
		verdict = "FAIL violated=" + strings.Join(v.violated, ",")
	}
	return fmt.Sprintf("chaos-fleet: databases=%d members=%d events=%d lost=%d duplicates=%d order_violations=%d reowned_within_lease=%d/%d max_reown_ms=%d "+
		"p99_ms_other_while_down=%d p99_ms_baseline=%d max_server_conns_per_db=%d budget=%d max_server_conns_per_db_handover=%d leases_moved_per_death=%.4f expected_1_over_n=%.4f "+
		"kills=%d nats_node_kills=%d db_stops=%d repartitions=%d verdict=%s",
		len(o.Databases), o.Members, v.Events, v.Lost, v.Duplicates, v.OrderViolations, v.Reowned, len(o.Kills), v.MaxReown.Milliseconds(),
		v.P99OtherDown.Milliseconds(), v.P99Baseline.Milliseconds(), v.MaxConns, o.Budget, v.MaxConnsHandover, v.MovedPerDeath, v.Expected,
		len(o.Kills), o.NATSNodeKills, o.DBStops, o.Repartitions, verdict)
}

// p99 is the 99th percentile of ds (nearest rank), zero for none.
func p99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return rank(s, 0.99)
}

// rank is the q-quantile of sorted, which is not empty (nearest rank).
func rank(sorted []time.Duration, q float64) time.Duration {
	return sorted[max(int(math.Ceil(q*float64(len(sorted))))-1, 0)]
}
