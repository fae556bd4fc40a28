package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
	"github.com/oncekit/oncekit/internal/wait"
	"github.com/oncekit/oncekit/outbox/fleet"
)

// FleetOptions configure a fleet run (RunFleet).
type FleetOptions struct {
	// Duration is how long writes and faults last; the drain follows. At
	// least 30s; 2m gives the stopped database its full 60 s.
	Duration time.Duration
	// Dir holds data and logs. Defaults to a new temp directory, removed
	// after a passing run.
	Dir string
	// Seed makes the choice of processes to kill repeatable.
	Seed uint64
	// Member returns how to start one fleet process with args (those of
	// FleetMemberMain): the binary, its arguments and extra environment.
	// Required: the chaos command runs itself, a test its test binary.
	Member func(args []string) (path string, argv, env []string)
	// Log receives progress lines. Defaults to io.Discard.
	Log io.Writer
	// Small runs 12 members in 4 processes over 5 databases (two on each
	// of two clusters and the stopped one), for a run beside other tests.
	Small bool
}

// The fleet run's shape. Eleven databases: five on each of two clusters and
// one alone on a third, which is stopped; thirty members in five processes.
const (
	fleetProcesses     = 5
	fleetPerProcess    = 6
	fleetReplicas      = 3
	fleetDBsPerCluster = 5
	fleetRate          = 50 // events per second per database
	fleetBatch         = 5  // events per writing transaction
	fleetPartitions    = 16 // migration 011's count
	fleetMaxConns      = 5  // fleet.Config's default MaxConnsPerDatabase
	fleetLease         = 3 * time.Second
	fleetMemberTTL     = 3 * time.Second
	fleetRepartition   = 12 // the count one database is repartitioned to
	fleetPoll          = 250 * time.Millisecond
	// fleetPublishTimeout bounds a relay's publish round and a publish's
	// wait for its ack alike.
	fleetPublishTimeout = 10 * time.Second
	fleetApp            = "fleetchaos-fleet"
	fleetBucketName     = "fleetchaos" // the members' bucket
)

// fleetPhases splits d: warm-up (then until the leases stand still), a
// baseline window without faults, the database stop (60 s, or half of a
// shorter run), a second baseline, and the kills (at least two process
// kills and two NATS node kills, however short; one of each in a small
// run). The two baselines together are as long as the stop, so that the
// latencies compared are as many on each side.
func fleetPhases(d time.Duration) (warm, base, down, kills time.Duration) {
	warm, down = min(10*time.Second, d/8), min(60*time.Second, d/2)
	base = down / 2
	return warm, base, down, max(d-warm-2*base-down, 0)
}

// RunFleet runs a relay fleet under faults and checks it: a three-node
// JetStream cluster, three throwaway PostgreSQL clusters holding eleven
// outbox databases written at 50 events/s each, thirty fleet members (k=3)
// in five processes; it stops the third cluster's database for up to 60 s,
// keeps a baseline window with every database up and no fault, then
// SIGKILLs fleet processes (restarted) and NATS nodes, drains, and checks
// what reached the stream (CheckFleet).
func RunFleet(ctx context.Context, opt FleetOptions) (v *FleetVerdict, err error) {
	log := opt.Log
	if log == nil {
		log = io.Discard
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(log, "chaos-fleet: %s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
	}
	if opt.Duration < 30*time.Second {
		return nil, fmt.Errorf("chaos-fleet: duration %s is below 30s", opt.Duration)
	}
	if opt.Member == nil {
		return nil, errors.New("chaos-fleet: FleetOptions.Member is required")
	}
	if opt.Seed == 0 {
		opt.Seed = uint64(time.Now().UnixNano())
	}
	temp := opt.Dir == ""
	if temp {
		if opt.Dir, err = os.MkdirTemp("", "oncekit-chaos-fleet-"); err != nil {
			return nil, err
		}
		defer func() {
			if err == nil && v.Pass() {
				_ = os.RemoveAll(opt.Dir)
			}
		}()
	}
	if err := os.Chmod(opt.Dir, 0o755); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(opt.Seed, 3))
	warm, base, downFor, killFor := fleetPhases(opt.Duration)
	logf("seed %d, dir %s, duration %s: warm-up %s, database down %s, baselines 2 x %s, kills %s", opt.Seed, opt.Dir, opt.Duration, warm, downFor, base, killFor)

	cluster, err := StartNATSCluster(ctx, filepath.Join(opt.Dir, "nats"), 3)
	if err != nil {
		return nil, err
	}
	defer cluster.Close()
	natsURL := strings.Join(cluster.URLs(), ",")
	if err := fleetStream(ctx, natsURL); err != nil {
		return nil, err
	}

	var pgs []*pgcluster.Cluster
	defer func() {
		for _, c := range pgs {
			c.Close()
		}
	}()
	for _, n := range []string{"pg-a", "pg-b", "pg-c"} {
		dir := filepath.Join(opt.Dir, n)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		c, err := StartPG(ctx, dir)
		if err != nil {
			return nil, err
		}
		pgs = append(pgs, c)
	}
	var dbs []*fleetDB
	defer func() {
		for _, d := range dbs {
			d.pool.Close()
		}
	}()
	nproc, perProc, perCluster := fleetProcesses, fleetPerProcess, fleetDBsPerCluster
	if opt.Small {
		nproc, perProc, perCluster = 4, 3, 2
	}
	for i := range 2*perCluster + 1 {
		d, err := newFleetDB(ctx, pgs[min(i/perCluster, 2)], fmt.Sprintf("db%02d", i))
		if err != nil {
			return nil, err
		}
		dbs = append(dbs, d)
	}
	downDB := dbs[len(dbs)-1]
	file := filepath.Join(opt.Dir, "fleet.json")
	b, err := fleetFile(dbs)
	if err == nil {
		err = os.WriteFile(file, b, 0o600)
	}
	if err != nil {
		return nil, err
	}
	logf("%d databases on %d PostgreSQL clusters (%s), migrations applied; nats %s", len(dbs), len(pgs), pgs[0].Addr()+" "+pgs[1].Addr()+" "+pgs[2].Addr(), natsURL)

	// The killed processes come back once the bound on re-ownership has
	// passed, so that what their death moved is measured before their new
	// members join: the databases those take over are handed to them,
	// each partition without an owner for up to a third of a lease.
	sup, err := NewSupervisor(SupervisorConfig{Dir: opt.Dir, Backoff: ReownBound(fleetLease) + time.Second})
	if err != nil {
		return nil, err
	}
	defer sup.Stop()
	var procs []string
	for i := range nproc {
		name := fmt.Sprintf("fleet-%d", i)
		mf := fleetMemberFlags{nats: natsURL, file: file, bucket: fleetBucketName, prefix: name, app: fleetApp,
			members: perProc, replicas: fleetReplicas, ttl: fleetMemberTTL, lease: fleetLease, poll: fleetPoll}
		path, argv, env := opt.Member(mf.args())
		if err := sup.Start(Role{Name: name, Path: path, Args: argv, Env: env}); err != nil {
			return nil, err
		}
		procs = append(procs, name)
	}
	logf("%d fleet members (k=%d) in %d processes, logs in %s", nproc*perProc, fleetReplicas, nproc, opt.Dir)

	obs := &FleetObservations{Members: nproc * perProc, DownDB: downDB.name, Lease: fleetLease,
		Budget: fleetReplicas * fleet.Budget(fleetPartitions, fleetReplicas, fleetMaxConns)}
	for _, d := range dbs {
		obs.Databases = append(obs.Databases, d.name)
	}
	// Load and sampling run in the background until the fault phases end.
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var bg sync.WaitGroup
	sampler := &connSampler{app: fleetApp, max: map[string]int{}, steadyMax: map[string]int{}}
	admin := make([]*pgxpool.Pool, 0, len(pgs))
	for _, c := range pgs {
		p, err := pgxpool.New(ctx, c.URL("postgres")+"&application_name=fleetchaos&connect_timeout=10")
		if err != nil {
			return nil, err
		}
		defer p.Close()
		admin = append(admin, p)
	}
	bg.Go(func() { sampler.run(loadCtx, admin) })
	var wmu sync.Mutex
	var commits, failures int
	for _, d := range dbs {
		bg.Go(func() {
			c, f := d.write(loadCtx, fleetRate, fleetBatch)
			wmu.Lock()
			commits, failures = commits+c, failures+f
			wmu.Unlock()
		})
	}
	start := time.Now()
	if !wait.Sleep(ctx, warm) {
		return nil, ctx.Err()
	}
	// One database's partition count changes online (16 to 12) while its
	// writer writes and its relays publish; the checker's order and loss
	// counts cover the change. A smaller count, because a member's
	// connection budget is sized from the count when it starts a
	// database's relay: with 32 partitions on budgets sized for 16, the
	// partitions of a killed member took 7 to 8 s to be owned again
	// (docs/proof.md). Partitions 12 to 15 stay leased until retention
	// empties them, so the leases checked after each kill are the same.
	if err := dbs[0].ob.Repartition(ctx, dbs[0].pool, fleetRepartition); err != nil {
		return nil, fmt.Errorf("repartition %s: %w", dbs[0].name, err)
	}
	obs.Repartitions++
	logf("repartitioned %s: %d partitions", dbs[0].name, fleetRepartition)
	// The members have joined once every lease stood still for a lease.
	if err := settleLeases(ctx, dbs); err != nil {
		logf("the leases did not settle before the baseline: %v", err)
	}
	sampler.steady.Store(true) // no member joins or leaves until the kills
	// The first baseline: every database up, no fault.
	before := Window{From: time.Now()}
	if !wait.Sleep(ctx, base) {
		return nil, ctx.Err()
	}
	before.To = time.Now()

	// One database stopped: its cluster, by `pg_ctl stop -m immediate`.
	logf("stopping %s (cluster %s) for %s", downDB.name, pgs[2].Addr(), downFor)
	if err := pgs[2].StopImmediate(); err != nil {
		return nil, err
	}
	obs.DBStops++
	// The whole outage, from the stop (the stopped database's relays
	// failing and backing off) to the start.
	obs.Down = Window{From: time.Now()}
	wait.Sleep(ctx, downFor)
	obs.Down.To = time.Now()
	if err := pgs[2].Start(ctx); err != nil {
		return nil, fmt.Errorf("start %s again: %w", pgs[2].Addr(), err)
	}
	logf("%s is up again", downDB.name)
	// The second baseline: every database up again, no fault.
	after := Window{From: time.Now()}
	if !wait.Sleep(ctx, base) {
		return nil, ctx.Err()
	}
	after.To = time.Now()
	obs.Baselines = []Window{before, after}

	sampler.steady.Store(false)
	nc, err := nats.Connect(natsURL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.Timeout(5*time.Second))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	kv, err := fleetBucket(ctx, nc)
	if err != nil {
		return nil, err
	}
	// Kills: a fleet process, then a NATS node, and so on until the phase
	// ends, two of each at least (one in a small run); after each process
	// kill, the wait for its partitions' new owners.
	live := dbs[:len(dbs)-1] // the stopped database's relays may still be backing off
	end := time.Now().Add(killFor)
	least := 2
	if opt.Small {
		least = 1
	}
	for i := 0; time.Now().Before(end) || len(obs.Kills) < least || obs.NATSNodeKills < least; i++ {
		if i%2 == 1 {
			n := rng.IntN(3)
			logf("killing NATS node %s", cluster.ServerName(n))
			if err := cluster.Kill(n); err != nil {
				return nil, err
			}
			obs.NATSNodeKills++
			wait.Sleep(ctx, 3*time.Second)
			if err := cluster.Restart(ctx, n); err != nil {
				return nil, err
			}
			continue
		}
		// The fleet stands still first (fleetsettle.go), so that what
		// moves is what this death moved, not what the last restart
		// still moves.
		if err := standMembers(ctx, kv, sup, procs, perProc); err != nil {
			logf("the members did not stand still before this kill: %v", err)
		}
		if err := settleLeases(ctx, live); err != nil {
			logf("the leases did not settle before this kill: %v", err)
		}
		var up []string
		for _, p := range procs {
			if sup.PID(p) != 0 && (len(obs.Kills) == 0 || p != obs.Kills[len(obs.Kills)-1].Process) {
				up = append(up, p)
			}
		}
		k, err := killFleetProcess(ctx, sup, up[rng.IntN(len(up))], perProc, live)
		if err != nil {
			return nil, err
		}
		logf("killed %s (%d members): partitions owned again after %s (each held by a survivor within %s), %d of %d leases moved", k.Process, k.Members, k.Reown, k.FirstReown, k.Moved, k.Total)
		if k.Reown < 0 || k.Reown > ReownBound(fleetLease)*2/3 {
			logf("the last partitions without a live owner: %s", strings.Join(k.Waiting, ", "))
		}
		obs.Kills = append(obs.Kills, k)
	}
	stopLoad()
	bg.Wait()
	logf("load stopped after %s: %d commits, %d failed (the stopped database's)", time.Since(start).Round(time.Second), commits, failures)

	if err := drainFleet(ctx, dbs, 90*time.Second, logf); err != nil {
		logf("drain: %v", err)
	}
	for _, d := range dbs {
		w, err := d.written(ctx)
		if err != nil {
			return nil, fmt.Errorf("read %s's writes: %w", d.name, err)
		}
		obs.Written = append(obs.Written, w...)
	}
	if obs.Stream, err = readStream(ctx, cluster.URLs(), "FLEETCHAOS"); err != nil {
		return nil, err
	}
	obs.MaxConns, obs.MaxConnsHandover = sampler.snapshot()
	v = CheckFleet(obs)
	logf("commit-to-publish p99 of the databases other than %s: %s while it was down; %s in the baselines pooled (%s before, %s after)",
		obs.DownDB, v.P99OtherDown, v.P99Baseline, at(v.P99EachBaseline, 0), at(v.P99EachBaseline, 1))
	for _, e := range v.Examples {
		logf("%s", e)
	}
	// Each second's latencies, kept with the run's logs (a passing run in a
	// temp directory keeps neither).
	if !temp || !v.Pass() {
		if err := saveLatencySeconds(filepath.Join(opt.Dir, "latency.tsv"), obs); err != nil {
			logf("latency by second: %v", err)
		} else {
			logf("latency by second in %s", filepath.Join(opt.Dir, "latency.tsv"))
		}
	}
	return v, nil
}

// fleetStream creates the run's stream: three replicas, JetStream's own
// 2-minute dedup window, so that "duplicates" counts what it let through.
func fleetStream(ctx context.Context, natsURL string) error {
	nc, err := nats.Connect(natsURL, nats.Timeout(5*time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	_, err = natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{Name: "FLEETCHAOS", Subjects: []string{fleetSubject + ".>"}, Replicas: 3, Duplicates: 2 * time.Minute})
	return err
}

// killFleetProcess SIGKILLs process name and waits until every partition
// of the live databases has an unexpired lease held by a member that did
// not die with it, or 3 leases.
func killFleetProcess(ctx context.Context, sup *Supervisor, name string, members int, live []*fleetDB) (FleetKill, error) {
	before := map[string]map[int]string{}
	for _, d := range live {
		o, err := d.owners(ctx)
		if err != nil {
			return FleetKill{}, err
		}
		before[d.name] = o
	}
	pid := sup.PID(name)
	k := FleetKill{Process: name, At: time.Now(), Members: members, Reown: -1}
	if err := sup.Kill(name); err != nil {
		return k, err
	}
	deadline := time.Now().Add(3 * fleetLease)
	// When each partition was first seen held by a survivor, and the
	// partitions not held at the last look: a partition held and then
	// unheld again was handed over, one never held was slow to be taken.
	first := map[string]time.Duration{}
	var waiting []string
	for time.Now().Before(deadline) && ctx.Err() == nil {
		moved, total, owned := 0, 0, true
		waiting = waiting[:0]
		for _, d := range live {
			o, err := d.owners(ctx)
			if err != nil {
				owned = false
				waiting = append(waiting, d.name+": "+err.Error())
				break
			}
			for p, owner := range o {
				total++
				at := fmt.Sprintf("%s/%d", d.name, p)
				if owner == "" || killedBy(owner, name, pid) {
					owned = false
					waiting = append(waiting, fmt.Sprintf("%s (held since %s: %t)", at, first[at], first[at] > 0))
				} else if _, ok := first[at]; !ok {
					first[at] = time.Since(k.At)
				}
				if before[d.name][p] != owner {
					moved++
				}
			}
		}
		if owned {
			k.Reown, k.Moved, k.Total = time.Since(k.At), moved, total
			break
		}
		k.Waiting = slices.Clone(waiting)
		wait.Sleep(ctx, 100*time.Millisecond)
	}
	for _, d := range first {
		k.FirstReown = max(k.FirstReown, d)
	}
	return k, ctx.Err()
}

// drainFleet waits until no database has an unpublished event, saying
// every 10 s which still have some.
func drainFleet(ctx context.Context, dbs []*fleetDB, within time.Duration, logf func(string, ...any)) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	said := time.Now()
	return wait.Until(ctx, 500*time.Millisecond, func(ctx context.Context) error {
		var left []string
		for _, d := range dbs {
			qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			n, err := d.pending(qctx)
			cancel()
			switch {
			case err != nil:
				left = append(left, fmt.Sprintf("%s: %v", d.name, err))
			case n > 0:
				left = append(left, fmt.Sprintf("%s: %d", d.name, n))
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Since(said) > 10*time.Second {
			said = time.Now()
			logf("draining: %s", strings.Join(left, ", "))
		}
		return fmt.Errorf("unpublished: %s", strings.Join(left, ", "))
	})
}

// at is ds[i], zero when ds is shorter.
func at(ds []time.Duration, i int) time.Duration {
	if i < len(ds) {
		return ds[i]
	}
	return 0
}
