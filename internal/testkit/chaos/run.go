package chaos

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
	"github.com/oncekit/oncekit/internal/wait"
)

// Options configure a chaos run.
type Options struct {
	// Duration is how long load and faults last; the drain follows.
	Duration time.Duration
	// Broken names a guarantee the payments example breaks on purpose
	// (PAYMENTS_BROKEN), one of BrokenBuilds. Empty runs the real thing.
	Broken string
	// Dir holds binaries, data and logs. Defaults to a new temp directory,
	// removed after a passing run.
	Dir string
	// Seed makes the run's choices repeatable (timing is not). Defaults to
	// the clock.
	Seed uint64
	// KillEvery is the mean pause between two SIGKILLs of a role process.
	// Defaults to 2s.
	KillEvery time.Duration
	// Rate paces the load's operations per second (zero: as fast as its
	// clients go, up to 100,000 operations in all).
	Rate float64
	// Relay is the relay the payments example runs: "" (the polling
	// relay) or "logical" (events in the WAL, the LogicalRelay).
	Relay string
	// Pooler is what stands between the daemons and PostgreSQL: "" or
	// "none" (the chaos proxy alone), or "pgbouncer" (PgBouncer in
	// transaction mode in front of the proxy; see PgBouncer).
	Pooler string
	// Failover replaces PostgreSQL's crash restarts with failovers to a
	// streaming standby: "" (none), "sync" or "async" (FailoverModes).
	Failover string
	// PG is the PostgreSQL major version to run: "" (the machine's newest)
	// or "17" (make pg17), whose failover slots keep the logical relay's
	// slot across a failover.
	PG string
	// Log receives progress lines. Defaults to io.Discard.
	Log io.Writer
}

// Result is a run's faults and verdict.
type Result struct {
	Verdict *Verdict
	// Kills counts role processes that died by SIGKILL: sent at random by the
	// run, or sent to themselves at an armed crash point.
	Kills, RandomKills, CrashpointKills int
	NATSNodeKills, PGRestarts           int
	// Failovers done (Options.Failover), each measured, and those refused
	// because the standby was not in sync.
	Failovers              int
	FailoverRecords        []FailoverRecord
	FailoversRefused       []string
	ConnDrops, CommitDrops int
	DriftExit              int
	Drained                bool
	Dir                    string
	Pooler                 string // Options.Pooler, "none" for none
	PoolerRestarts         int    // PgBouncer deaths the run restarted it from
	Failover               string // Options.Failover, "none" for none
	// Replay is the stream window replayed to the consumer after an
	// asynchronous failover, and the lost effects before it.
	Replay            string
	LostEffectsBefore int
}

// Line is the run's machine-readable last line.
func (r *Result) Line() string {
	verdict := "PASS"
	if !r.Verdict.Pass() {
		verdict = "FAIL violated=" + strings.Join(r.Verdict.Violated(), ",")
	}
	failover := ""
	if r.Failover != "" && r.Failover != "none" {
		failover = fmt.Sprintf(" failovers_refused=%d %s%s lost_effects_before_replay=%d", len(r.FailoversRefused), lagSummary(r.FailoverRecords), recoverySummary(r.FailoverRecords), r.LostEffectsBefore)
		for _, f := range strings.Fields(strings.TrimPrefix(r.Replay, "replay: ")) {
			failover += " replay_" + f
		}
	}
	pooler := cmp.Or(r.Pooler, "none")
	if pooler != "none" {
		failover += fmt.Sprintf(" pooler_restarts=%d", r.PoolerRestarts)
	}
	return fmt.Sprintf("chaos: %s kills=%d random_kills=%d crashpoint_kills=%d nats_node_kills=%d pg_restarts=%d failovers=%d conn_drops=%d commit_drops=%d drift_exit=%d%s pooler=%s failover=%s verdict=%s",
		r.Verdict.Summary(), r.Kills, r.RandomKills, r.CrashpointKills, r.NATSNodeKills, r.PGRestarts, r.Failovers, r.ConnDrops, r.CommitDrops, r.DriftExit, failover, pooler, cmp.Or(r.Failover, "none"), verdict)
}

// BrokenBuilds names the payments example's deliberately broken builds
// (Options.Broken), in the order a payment meets the guarantee each breaks.
var BrokenBuilds = []string{"key-only-edge", "edge-stores-after-commit", "relay-marks-before-ack", "ack-before-commit",
	"claim-apart", "gate-bypassed", "call-before-fired", "fresh-provider-key"}

// FailoverBrokenBuilds break what synchronous replication promises, so
// that only a run with failovers in sync mode can catch them: the API
// committing its payments, or the consumer its claims, without waiting
// for the standby.
var FailoverBrokenBuilds = []string{"payment-commit-local", "claim-commit-local"}

// The crash points each role can be armed with on a restart: every named
// point between two writes of the chain.
var crashPoints = map[string][]string{
	"api":      {"idempotency.before-commit"},                            // handler done, response not stored
	"relay":    {"relay.after-publish"},                                  // published, not marked
	"consume":  {"inbox.before-commit", "inbox.after-commit"},            // handled, not committed; committed, not acked
	"dispatch": {"sideeffect.after-fired", "sideeffect.before-complete"}, // fired, not called; called, not confirmed
}

// logicalRelayCrashPoints are the relay's with Options.Relay "logical":
// published, not confirmed.
var logicalRelayCrashPoints = []string{"logical.after-publish"}

// brokenCrashPoints replace a role's crash points in the broken builds
// whose bug opens a window between two writes of their own.
var brokenCrashPoints = map[string]map[string][]string{
	"edge-stores-after-commit": {"api": {"idempotency.before-store"}},          // payment committed, response not stored
	"relay-marks-before-ack":   {"relay": {"payments.marked-not-published"}},   // marked published, not yet sent
	"call-before-fired":        {"dispatch": {"payments.called-not-recorded"}}, // called, attempt not committed
	"ack-before-commit":        {"consume": {"inbox.before-commit"}},           // acked, not committed
	"claim-apart":              {"consume": {"inbox.before-commit"}},           // claimed, work not committed
	"gate-bypassed":            {"consume": {"inbox.before-commit"}},           // handled, not committed: the lane's later messages go elsewhere
}

const schema = "payments"

// Run builds the payments example, starts a three-node JetStream cluster, a
// PostgreSQL cluster of its own behind a connection-dropping proxy, two
// processes of every role and the provider, sends load and hostile
// messages (Hostile) while killing processes, NATS nodes and PostgreSQL,
// drains, and checks the history.
func Run(ctx context.Context, opt Options) (res *Result, err error) {
	log := opt.Log
	if log == nil {
		log = io.Discard
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(log, "chaos: %s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
	}
	if opt.Relay != "" && opt.Relay != "logical" {
		return nil, fmt.Errorf("chaos: no relay %q (the polling one, or logical)", opt.Relay)
	}
	if opt.Pooler != "" && !slices.Contains(Poolers, opt.Pooler) {
		return nil, fmt.Errorf("chaos: no pooler %q (there are %s)", opt.Pooler, strings.Join(Poolers, ", "))
	}
	if opt.Failover != "" && !slices.Contains(FailoverModes, opt.Failover) {
		return nil, fmt.Errorf("chaos: no failover %q (there are %s)", opt.Failover, strings.Join(FailoverModes, ", "))
	}
	if opt.Broken != "" && !slices.Contains(BrokenBuilds, opt.Broken) && !slices.Contains(FailoverBrokenBuilds, opt.Broken) {
		return nil, fmt.Errorf("chaos: no broken build %q (there are %s, and with failovers %s)", opt.Broken, strings.Join(BrokenBuilds, ", "), strings.Join(FailoverBrokenBuilds, ", "))
	}
	if opt.PG != "" && opt.PG != "17" {
		return nil, fmt.Errorf("chaos: no PostgreSQL %q (the machine's, or 17)", opt.PG)
	}
	if opt.Relay == "logical" && opt.Failover != "" && opt.PG != "17" {
		return nil, errors.New("chaos: the logical relay's slot survives a failover only on PostgreSQL 17 (failover slots): add PG=17")
	}
	if slices.Contains(FailoverBrokenBuilds, opt.Broken) && opt.Failover != "sync" {
		return nil, fmt.Errorf("chaos: the broken build %q breaks synchronous replication: run it with failovers in sync mode", opt.Broken)
	}
	if opt.Seed == 0 {
		opt.Seed = uint64(time.Now().UnixNano())
	}
	if opt.Dir == "" {
		if opt.Dir, err = os.MkdirTemp("", "oncekit-chaos-"); err != nil {
			return nil, err
		}
		defer func() {
			if err == nil && res.Verdict.Pass() {
				_ = os.RemoveAll(opt.Dir)
			}
		}()
	}
	if err := os.Chmod(opt.Dir, 0o755); err != nil {
		return nil, err
	}
	res = &Result{Dir: opt.Dir, Pooler: cmp.Or(opt.Pooler, "none"), Failover: cmp.Or(opt.Failover, "none")}
	rng := rand.New(rand.NewPCG(opt.Seed, 1))
	logf("seed %d, dir %s, duration %s, broken %q, relay %q, pooler %s, failover %s", opt.Seed, opt.Dir, opt.Duration, opt.Broken, cmp.Or(opt.Relay, "polling"), res.Pooler, res.Failover)

	bin, err := build(ctx, opt.Dir)
	if err != nil {
		return nil, err
	}
	pgs, err := startPostgres(ctx, opt, logf)
	if err != nil {
		return nil, err
	}
	defer pgs.Close()
	defer func() {
		if err != nil || !res.Verdict.Pass() {
			logf("postgres data kept in %s", pgs.Keep())
		}
	}()
	proxy, err := NewPGProxy(pgs.Primary().Addr())
	if err != nil {
		return nil, err
	}
	defer proxy.Close()
	pgs.Follow(proxy)
	// The services' direct address: the server itself or, with failovers,
	// an address without faults that follows the primary.
	direct := pgs.Primary().URL("postgres")
	if pgs.replicated() {
		vip, err := NewPGProxy(pgs.Primary().Addr())
		if err != nil {
			return nil, err
		}
		defer vip.Close()
		pgs.Follow(vip)
		direct = strings.Replace(direct, pgs.Primary().Addr(), vip.Addr(), 1)
	}
	var bouncer *PgBouncer
	if res.Pooler == "pgbouncer" {
		if bouncer, err = StartPgBouncer(ctx, filepath.Join(opt.Dir, "pgbouncer"), proxy.Addr()); err != nil {
			return nil, err
		}
		defer bouncer.Close()
		logf("pgbouncer %s (transaction pooling) in front of the proxy, log in %s", bouncer.Addr(), bouncer.Dir())
	}
	cluster, err := StartNATSCluster(ctx, filepath.Join(opt.Dir, "nats"), 3)
	if err != nil {
		return nil, err
	}
	defer cluster.Close()
	proxied := strings.Replace(pgs.Primary().URL("postgres"), pgs.Primary().Addr(), proxy.Addr(), 1)
	natsURL := strings.Join(cluster.URLs(), ",")
	logf("postgres %s (proxy %s, direct %s), nats %s (%s)", pgs.Primary().Addr(), proxy.Addr(), direct, natsURL, cluster.NATSServerVersion())

	logical := "PAYMENTS_LOGICAL="
	if opt.Relay == "logical" {
		logical += "1"
	}
	env := []string{"NATS_URL=" + natsURL, "PAYMENTS_SCHEMA=" + schema, "PAYMENTS_BROKEN=" + opt.Broken, logical}
	setup := exec.CommandContext(ctx, bin.payments, "setup", "-replicas", "3")
	setup.Env = append(os.Environ(), "DATABASE_URL="+direct, "NATS_URL="+natsURL, "PAYMENTS_SCHEMA="+schema, logical)
	if out, err := setup.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("payments setup: %w: %s", err, out)
	}

	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	providerURL := fmt.Sprintf("http://127.0.0.1:%d", ports[2])
	apis := []string{fmt.Sprintf("http://127.0.0.1:%d", ports[0]), fmt.Sprintf("http://127.0.0.1:%d", ports[1])}

	var faulting atomic.Bool
	faulting.Store(true)
	var armMu sync.Mutex
	armRng := rand.New(rand.NewPCG(opt.Seed, 2))
	// A restarted process is armed with one of its role's crash points
	// (six restarts in ten), to die there at a random hit.
	sup, err := NewSupervisor(SupervisorConfig{Dir: opt.Dir, StartEnv: func(name string, start int) []string {
		points := crashPoints[roleOf(name)]
		if opt.Relay == "logical" && roleOf(name) == "relay" {
			points = logicalRelayCrashPoints
		}
		if bp, ok := brokenCrashPoints[opt.Broken][roleOf(name)]; ok {
			points = bp
		}
		armMu.Lock()
		defer armMu.Unlock()
		if start == 1 || !faulting.Load() || len(points) == 0 || armRng.Float64() < 0.4 {
			return nil
		}
		return []string{
			"ONCEKIT_CRASHPOINT=" + points[armRng.IntN(len(points))],
			fmt.Sprintf("ONCEKIT_CRASHPOINT_AFTER=%d", 1+armRng.IntN(20)),
		}
	}})
	if err != nil {
		return nil, err
	}
	defer sup.Stop()
	procs := []struct {
		name string
		args []string
	}{
		{"provider", []string{"provider", "-listen", strings.TrimPrefix(providerURL, "http://"), "-fail-rate", "0.05", "-lose-rate", "0.1"}},
		{"api-1", []string{"api", "-listen", strings.TrimPrefix(apis[0], "http://")}},
		{"api-2", []string{"api", "-listen", strings.TrimPrefix(apis[1], "http://")}},
		{"relay-1", []string{"relay"}}, {"relay-2", []string{"relay"}},
		{"consume-1", []string{"consume"}}, {"consume-2", []string{"consume"}},
		{"dispatch-1", []string{"dispatch", "-provider", providerURL}}, {"dispatch-2", []string{"dispatch", "-provider", providerURL}},
	}
	var names []string
	for _, p := range procs {
		names = append(names, p.name)
	}
	urls, err := roleURLs(ctx, bouncer, direct, proxied, opt.Relay, names)
	if err != nil {
		return nil, err
	}
	var killable []string
	for _, p := range procs {
		roleEnv := append(slices.Clip(env), "DATABASE_URL="+urls[p.name])
		if err := sup.Start(Role{Name: p.name, Path: bin.payments, Args: p.args, Env: roleEnv}); err != nil {
			return nil, err
		}
		if p.name != "provider" {
			killable = append(killable, p.name)
		}
	}
	for _, u := range append([]string{providerURL + "/calls"}, apis[0]+"/healthz", apis[1]+"/healthz") {
		if err := waitHTTP(ctx, u); err != nil {
			return nil, fmt.Errorf("%s: %w (logs in %s)", u, err, opt.Dir)
		}
	}

	// Load and faults, for Duration.
	history := &History{}
	loadCtx, stopLoad := context.WithTimeout(ctx, opt.Duration)
	defer stopLoad()
	load := &Load{APIs: apis, Seed: opt.Seed, History: history, Rate: opt.Rate}
	var wg sync.WaitGroup
	wg.Go(func() { load.Run(loadCtx) })
	proxy.SetCommitDropRate(0.03)
	wg.Go(func() { res.RandomKills = killLoop(loadCtx, sup, killable, rng, cmpDur(opt.KillEvery, 2*time.Second)) })
	wg.Go(func() { res.NATSNodeKills = natsLoop(loadCtx, cluster, opt.Duration, opt.Seed, logf) })
	if pgs.replicated() {
		pgs.Topology.BeforeCut = func(ctx context.Context) func() {
			return pauseConsumers(ctx, sup, 2*time.Second)
		}
		wg.Go(func() { res.Failovers = failoverLoop(loadCtx, pgs.Topology, opt.Duration, logf) })
	} else {
		wg.Go(func() { res.PGRestarts = pgLoop(loadCtx, pgs.Primary(), opt.Duration, logf) })
	}
	wg.Go(func() { dropLoop(loadCtx, proxy) })
	wg.Go(func() { progress(loadCtx, history, sup, bouncer, logf) })
	hostile := &Hostile{}
	wg.Go(func() { hostileLoop(loadCtx, cluster.URLs(), 200*time.Millisecond, hostile) })
	wg.Wait()
	faulting.Store(false)
	proxy.SetCommitDropRate(0)
	ps := proxy.Stats()
	res.ConnDrops, res.CommitDrops = int(ps.Drops), int(ps.CommitDrops)
	logf("load and faults over: %d operations; draining", history.Len())

	// Drain: every fault healed, processes restarted without crash points.
	if pgs.replicated() {
		res.FailoverRecords, res.FailoversRefused = pgs.Records()
	}
	if err := heal(ctx, cluster, pgs.Primary(), bouncer, direct); err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, direct)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	res.Drained, err = drain(ctx, pool, logf)
	if err != nil {
		return nil, err
	}
	st := sup.Stats()
	res.Kills, res.CrashpointKills = st.Kills+st.CrashPoints, st.CrashPoints
	if bouncer != nil {
		res.PoolerRestarts = bouncer.Restarts()
	}

	calls, err := providerCalls(ctx, providerURL)
	if err != nil {
		return nil, err
	}
	stream, err := readStream(ctx, cluster.URLs(), "PAYMENTS")
	if err != nil {
		return nil, err
	}
	v, err := Check(ctx, pool, schema, CheckOptions{Logical: opt.Relay == "logical", Erasable: opt.Failover == "async"}, history.Ops(), calls, stream, hostile)
	if err != nil {
		return nil, err
	}
	if len(res.FailoverRecords) > 0 {
		applied, err := appliedTimes(ctx, pool)
		if err != nil {
			return nil, err
		}
		measureRecovery(res.FailoverRecords, history.Ops(), stream, applied, calls)
		for i, r := range res.FailoverRecords {
			logf("failover %d recovery after promotion: api %s, relay %s, consume %s, dispatch %s", i+1,
				r.Recovered["api"].Round(time.Millisecond), r.Recovered["relay"].Round(time.Millisecond),
				r.Recovered["consume"].Round(time.Millisecond), r.Recovered["dispatch"].Round(time.Millisecond))
		}
	}
	if opt.Failover == "async" {
		// Claims erased after their message was acked: replay the stream
		// to the consumer, as docs/operations.md tells an operator to,
		// and check again.
		res.LostEffectsBefore = v.LostEffects
		logf("before the replay: %d lost effects, %d phantoms, %d erased; replaying the stream", v.LostEffects, v.Phantoms, v.Erased)
		if res.Replay, err = replayStream(ctx, bin.payments, env, direct); err != nil {
			return nil, err
		}
		logf("%s", res.Replay)
		if res.Drained, err = drain(ctx, pool, logf); err != nil {
			return nil, err
		}
		if calls, err = providerCalls(ctx, providerURL); err != nil {
			return nil, err
		}
		if v, err = Check(ctx, pool, schema, CheckOptions{Logical: opt.Relay == "logical", Erasable: true}, history.Ops(), calls, stream, hostile); err != nil {
			return nil, err
		}
	}
	res.Verdict = v
	var out bytes.Buffer
	res.DriftExit = runDrift(ctx, bin.oncekit, direct, &out)
	switch {
	case res.DriftExit != 0 && opt.Failover == "async" && v.PhantomEffects > 0:
		// Drift finds the effects of phantoms: what it is for.
		logf("oncekit drift exited %d, as expected with %d phantom effects:\n%s", res.DriftExit, v.PhantomEffects, headLines(out.String(), 20))
	case res.DriftExit != 0:
		v.fail(InvDriftClean, "oncekit drift exited %d:\n%s", res.DriftExit, headLines(out.String(), 40))
	}
	for inv, n := range v.Consequences {
		logf("consequence of erasure: %s, %d times, e.g. %s", inv, n, strings.Join(v.Violations[inv], "; "))
	}
	if !v.Pass() {
		for _, inv := range v.Violated() {
			for _, ex := range v.Violations[inv] {
				logf("VIOLATION %s: %s", inv, ex)
			}
		}
		if !res.Drained {
			diagnose(ctx, cluster.URLs(), opt.Dir, logf)
		}
		logf("data and logs kept in %s", opt.Dir)
	}
	return res, nil
}

type binaries struct{ payments, oncekit string }

// build compiles the example and the CLI (a module of its own) as they
// would be deployed.
func build(ctx context.Context, dir string) (binaries, error) {
	b := binaries{payments: filepath.Join(dir, "payments"), oncekit: filepath.Join(dir, "oncekit")}
	root, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/oncekit/oncekit").Output()
	if err != nil {
		return b, fmt.Errorf("find the module: %w", err)
	}
	for out, pkg := range map[string]string{b.payments: "./examples/payments", b.oncekit: "./cmd/oncekit"} {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out, ".")
		cmd.Dir = filepath.Join(strings.TrimSpace(string(root)), pkg)
		if msg, err := cmd.CombinedOutput(); err != nil {
			return b, fmt.Errorf("go build %s: %w: %s", pkg, err, msg)
		}
	}
	return b, nil
}

func roleOf(name string) string {
	role, _, _ := strings.Cut(name, "-")
	return role
}

func cmpDur(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// killLoop SIGKILLs a random role process every ~every.
func killLoop(ctx context.Context, sup *Supervisor, names []string, rng *rand.Rand, every time.Duration) int {
	kills := 0
	for wait.Sleep(ctx, every/2+time.Duration(rng.Int64N(int64(every)))) {
		if sup.Kill(names[rng.IntN(len(names))]) == nil {
			kills++
		}
	}
	return kills
}

// natsLoop SIGKILLs one NATS node at a time and restarts it, a few times a
// run: at least once.
func natsLoop(ctx context.Context, c *NATSCluster, d time.Duration, seed uint64, logf func(string, ...any)) int {
	every := min(max(d/4, 15*time.Second), 40*time.Second)
	kills := 0
	for i := int(seed % 3); wait.Sleep(ctx, every*2/3); i = (i + 1) % 3 {
		if err := c.Kill(i); err != nil {
			logf("nats kill %d: %v", i, err)
			continue
		}
		kills++
		logf("nats node %s SIGKILLed", c.ServerName(i))
		wait.Sleep(ctx, 3*time.Second)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		if err := c.Restart(rctx, i); err != nil {
			logf("nats restart %d: %v", i, err)
		}
		cancel()
	}
	return kills
}

// pgLoop stops PostgreSQL immediately (a crash: no checkpoint, recovery on
// start) twice a run, at a third and at two thirds.
func pgLoop(ctx context.Context, pg *pgcluster.Cluster, d time.Duration, logf func(string, ...any)) int {
	restarts := 0
	for range 2 {
		if !wait.Sleep(ctx, d/3) {
			break
		}
		if err := pg.StopImmediate(); err != nil {
			logf("pg stop: %v", err)
			continue
		}
		logf("postgres stopped -m immediate")
		wait.Sleep(ctx, time.Second)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		err := pg.Start(rctx)
		cancel()
		if err != nil {
			logf("pg start: %v", err)
			continue
		}
		restarts++
	}
	return restarts
}

// dropLoop cuts a random PostgreSQL connection every second or so, on top
// of the COMMITs the proxy cuts.
func dropLoop(ctx context.Context, p *PGProxy) {
	for wait.Sleep(ctx, 1500*time.Millisecond) {
		p.DropRandom(1)
	}
}

func progress(ctx context.Context, h *History, sup *Supervisor, b *PgBouncer, logf func(string, ...any)) {
	start := time.Now()
	for wait.Sleep(ctx, 10*time.Second) {
		st := sup.Stats()
		var pools string
		if b != nil {
			pools = "; pgbouncer " + b.Pools(ctx)
		}
		logf("%3.0fs: %d operations, %d random kills, %d crash-point kills%s", time.Since(start).Seconds(), h.Len(), st.Kills, st.CrashPoints, pools)
	}
}

// heal brings every NATS node and PostgreSQL back, and waits until the
// pooler, if any, serves again (it reconnects to PostgreSQL by itself).
func heal(ctx context.Context, c *NATSCluster, pg *pgcluster.Cluster, b *PgBouncer, direct string) error {
	hctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if conn, err := pgx.Connect(hctx, pg.URL("postgres")); err == nil {
		_ = conn.Close(hctx)
	} else if err := pg.Start(hctx); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	if b != nil {
		if err := b.waitServing(hctx, direct); err != nil {
			return err
		}
	}
	// natsLoop restarts every node it kills; a restarted one catches up.
	return poll(hctx, c.Healthy)
}

// drain waits until the chain has caught up: every payment in the ledger,
// every effect settled, the outbox empty; or until nothing has moved for
// 30 s (a broken build never catches up), or 5 minutes.
func drain(ctx context.Context, pool *pgxpool.Pool, logf func(string, ...any)) (bool, error) {
	// Ledger entries and effects count only for payments that exist: after
	// an asynchronous failover, phantoms have them too.
	const q = `SELECT
		(SELECT count(*) FROM "` + schema + `".payments),
		(SELECT count(DISTINCT l.payment_id) FROM "` + schema + `".ledger_entries l
			JOIN "` + schema + `".payments p ON p.id = l.payment_id),
		(SELECT count(*) FROM "` + schema + `".side_effects s
			JOIN "` + schema + `".payments p ON p.id::text = s.source_id WHERE s.state = 'confirmed'),
		(SELECT count(*) FROM "` + schema + `".side_effects WHERE state IN ('pending', 'fired')),
		(SELECT count(*) FROM "` + schema + `".processed_messages)`
	deadline := time.Now().Add(5 * time.Minute)
	var last [5]int64
	moved := time.Now()
	for {
		var now [5]int64
		err := pool.QueryRow(ctx, q).Scan(&now[0], &now[1], &now[2], &now[3], &now[4])
		if err == nil {
			if now[0] == now[1] && now[2] == 2*now[0] && now[3] == 0 {
				logf("drained: %d payments, %d effects confirmed", now[0], now[2])
				return true, nil
			}
			if now != last {
				last, moved = now, time.Now()
			}
		}
		if time.Since(moved) > 30*time.Second || time.Now().After(deadline) {
			logf("not drained: payments=%d in_ledger=%d confirmed=%d pending_or_fired=%d", now[0], now[1], now[2], now[3])
			return false, nil
		}
		if !wait.Sleep(ctx, time.Second) {
			return false, ctx.Err()
		}
	}
}

// appliedTimes reads when each ledger entry was applied.
func appliedTimes(ctx context.Context, pool *pgxpool.Pool) ([]time.Time, error) {
	rows, err := pool.Query(ctx, `SELECT applied_at FROM "`+schema+`".ledger_entries`)
	if err != nil {
		return nil, fmt.Errorf("read the ledger's times: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[time.Time])
}

// replayStream runs the consumer's replay of the whole stream (from its
// first message to its last at the start), as an operator does after an
// asynchronous failover, and returns its summary line.
func replayStream(ctx context.Context, payments string, env []string, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, payments, "consume", "-replay-from", "1")
	cmd.Env = append(append(os.Environ(), env...), "DATABASE_URL="+url)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("payments consume -replay-from 1: %w: %s", err, headLines(string(out), 20))
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1], nil
}

// runDrift runs `oncekit drift` as an operator would, with the service's
// expectations, and returns its exit code.
func runDrift(ctx context.Context, oncekit, url string, out io.Writer) int {
	payments := `SELECT id FROM "` + schema + `".payments`
	cmd := exec.CommandContext(ctx, oncekit, "drift", "--database-url", url, "--schema", schema,
		"--expect", "payment_captured="+effectKindCapture+":"+payments,
		"--expect", "payment_receipted="+effectKindReceipt+":"+payments,
		"--rule", `ledger_once=SELECT p.id FROM "`+schema+`".payments p LEFT JOIN "`+schema+`".ledger_entries l ON l.payment_id = p.id GROUP BY p.id HAVING count(l.id) <> 1`,
		// The hostile messages' dead letters are expected (the checker
		// accounts for each): drift counts every other one.
		"--skip", "dead_letters",
		"--rule", `unexpected_dead_letters=SELECT 'dead letter ' || id FROM "`+schema+`".dead_letters
			WHERE replayed_at IS NULL AND substring(payload FROM 1 FOR 8) <> '`+hostilePrefix+`'::bytea`)
	cmd.Stdout, cmd.Stderr = out, out
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	if err != nil {
		fmt.Fprintln(out, err)
		return -1
	}
	return 0
}

// pauseConsumers stops the consumers for d and returns the function that
// resumes them: the events published meanwhile wait for them, and meet
// them all at once when they resume.
func pauseConsumers(ctx context.Context, sup *Supervisor, d time.Duration) func() {
	roles := []string{"consume-1", "consume-2"}
	for _, r := range roles {
		_ = sup.Pause(r) // one restarting starts at the resume
	}
	wait.Sleep(ctx, d)
	return func() {
		for _, r := range roles {
			_ = sup.Resume(r)
		}
	}
}
