package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// e2eRates are the rates BenchmarkLatencyE2E runs at, in events/s:
// ONCEKIT_BENCH_E2E_RATES (comma-separated), default 100, 1000 and 5000.
func e2eRates() []int {
	rates := []int{100, 1000, 5000}
	if v := os.Getenv("ONCEKIT_BENCH_E2E_RATES"); v != "" {
		rates = rates[:0]
		for _, f := range strings.Split(v, ",") {
			if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && n > 0 {
				rates = append(rates, n)
			}
		}
	}
	return rates
}

// BenchmarkLatencyE2E measures what a service feels: the time from the
// producer's commit to the consumer's handler having committed, for events
// committed one per transaction at each rate of e2eRates for
// ONCEKIT_BENCH_E2E_SECONDS (default 5; the first second is left out as
// warm-up). Three contenders run in each iteration, one after the other,
// on fresh schemas and streams:
//
//   - bare: the business row committed, then a synchronous JetStream
//     publish; a JetStream consumer with four workers commits a row per
//     message (one INSERT, committed on its own: one round trip) and acks
//     it. The least any service pays for a commit, a publish and a
//     consuming commit on this machine.
//   - poll: the business row and its event committed together
//     (outbox.Enqueue), the relay with its defaults (polling) publishing,
//     and inbox.Consumer as the README's quickstart sets it up (four
//     workers, BatchSize 100) committing a row and its claim: oncekit as
//     the README deploys it.
//   - logical: poll with the event written into the WAL
//     (outbox.Config.Logical) and the LogicalRelay following it.
//
// All three run on a PostgreSQL cluster of the benchmark's own with
// wal_level=logical (e2eCluster), so that they meet the same server. Each
// runs quiet, and again contended: one busy-looping process per core,
// started by the benchmark around all three, so that all suffer the same
// contention. It reports each contender's p50 and p99 in milliseconds,
// poll's and logical's as ratios to bare's in the same iteration
// (poll-x-bare-p50, logical-x-bare-p99...), and their p50 from the commit
// to the handler's start (poll-start-p50-ms: the relay, JetStream and the
// claim; the rest is the handler's statement and the commit).
func BenchmarkLatencyE2E(b *testing.B) {
	secs := relayEnvInt("ONCEKIT_BENCH_E2E_SECONDS", 5)
	for _, contended := range []bool{false, true} {
		cond := "quiet"
		if contended {
			cond = "contended"
		}
		for _, rate := range e2eRates() {
			b.Run(fmt.Sprintf("%s-%d", cond, rate), func(b *testing.B) {
				for i := range b.N {
					if contended {
						stop := startHog(b)
						defer stop()
					}
					// The order rotates, so that none always runs on the
					// warmer (or more tired) machine.
					names := []string{"bare", "poll", "logical"}
					got := map[string]e2eResult{}
					for k := range names {
						name := names[(i+k)%len(names)]
						got[name] = e2eRun(b, name, rate, secs)
					}
					bare := got["bare"]
					b.ReportMetric(bare.rate, "bare-events/s")
					b.ReportMetric(percentile(bare.lat, 0.50), "bare-p50-ms")
					b.ReportMetric(percentile(bare.lat, 0.99), "bare-p99-ms")
					b.ReportMetric(float64(bare.producerCPU.Nanoseconds())/1000, "bare-pg-producer-µs/event")
					for _, name := range names[1:] {
						r := got[name]
						p50, p99 := percentile(r.lat, 0.50), percentile(r.lat, 0.99)
						b.ReportMetric(r.rate, name+"-events/s")
						b.ReportMetric(p50, name+"-p50-ms")
						b.ReportMetric(p99, name+"-p99-ms")
						b.ReportMetric(percentile(r.started, 0.50), name+"-start-p50-ms")
						b.ReportMetric(percentile(r.started, 0.99), name+"-start-p99-ms")
						b.ReportMetric(p50/percentile(bare.lat, 0.50), name+"-x-bare-p50")
						b.ReportMetric(p99/percentile(bare.lat, 0.99), name+"-x-bare-p99")
						b.ReportMetric(float64(r.producerCPU.Nanoseconds())/1000, name+"-pg-producer-µs/event")
					}
				}
			})
		}
	}
}

// percentile is the p-quantile of sorted latencies.
func percentile(sorted []float64, p float64) float64 {
	return sorted[min(int(p*float64(len(sorted))), len(sorted)-1)]
}

// startHog starts one busy-looping process per CPU and returns what stops
// them.
func startHog(b *testing.B) func() {
	b.Helper()
	var procs []*exec.Cmd
	for range max(1, nproc()) {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		procs = append(procs, cmd)
	}
	return func() {
		for _, p := range procs {
			_ = p.Process.Signal(syscall.SIGKILL)
			_ = p.Wait()
		}
	}
}

func nproc() int {
	out, err := exec.Command("nproc").Output()
	if err != nil {
		return 2
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		return 2
	}
	return n
}

// e2eWorld is one contender's fresh schema, stream and pools: the
// producer's, and the consumer's, whose commits it times.
type e2eWorld struct {
	db      *testenv.DB
	nats    *testenv.NATS
	stream  string
	prod    *pgxpool.Pool
	cons    *pgxpool.Pool
	handled *commitClock
	started *commitClock // poll: when each handler started
}

func newE2EWorld(b testing.TB) *e2eWorld {
	b.Helper()
	ctx := context.Background()
	w := &e2eWorld{db: testenv.NewDBOn(b, e2eURL(b)), nats: testenv.NewNATS(b), stream: "e2e_" + uuid.NewString()[:8],
		handled: newCommitClock(), started: newCommitClock()}
	if _, err := w.db.Pool.Exec(ctx, `CREATE TABLE e2e_payments (id uuid PRIMARY KEY, amount bigint NOT NULL);
		CREATE TABLE e2e_ledger (id uuid PRIMARY KEY)`); err != nil {
		b.Fatal(err)
	}
	if _, err := natsjs.EnsureStream(ctx, w.nats.JS, natsjs.StreamConfig{Name: w.stream, Subjects: []string{w.stream}}); err != nil {
		b.Fatal(err)
	}
	pcfg, err := pgxpool.ParseConfig(w.db.URL)
	if err != nil {
		b.Fatal(err)
	}
	pcfg.MaxConns = writers + 8 // the writers, and the relay's connections
	pcfg.ConnConfig.RuntimeParams["application_name"] = e2eProducerApp
	if w.prod, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(w.prod.Close)
	cfg, err := pgxpool.ParseConfig(w.db.URL)
	if err != nil {
		b.Fatal(err)
	}
	cfg.ConnConfig.Tracer = w.handled
	if w.cons, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(w.cons.Close)
	return w
}

func (w *e2eWorld) close() {
	w.prod.Close()
	w.cons.Close()
	w.db.Close()
	w.nats.Close()
}

// commitClock is a pgx tracer on the consumer's pool: it notes the time
// each transaction's COMMIT returned for the messages its handlers wrote.
type commitClock struct {
	mu      sync.Mutex
	pending map[*pgx.Conn][]uuid.UUID
	at      map[uuid.UUID]time.Time
}

func newCommitClock() *commitClock {
	return &commitClock{pending: map[*pgx.Conn][]uuid.UUID{}, at: map[uuid.UUID]time.Time{}}
}

// wrote notes that the transaction open on conn wrote id.
func (c *commitClock) wrote(conn *pgx.Conn, id uuid.UUID) {
	c.mu.Lock()
	c.pending[conn] = append(c.pending[conn], id)
	c.mu.Unlock()
}

// committed notes ids as committed now.
func (c *commitClock) committed(ids ...uuid.UUID) {
	now := time.Now()
	c.mu.Lock()
	for _, id := range ids {
		if _, ok := c.at[id]; !ok {
			c.at[id] = now
		}
	}
	c.mu.Unlock()
}

func (c *commitClock) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.at)
}

func (c *commitClock) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (c *commitClock) TraceQueryEnd(_ context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	tag := data.CommandTag.String()
	if tag != "COMMIT" && tag != "ROLLBACK" && data.Err == nil {
		return
	}
	c.mu.Lock()
	ids := c.pending[conn]
	delete(c.pending, conn)
	c.mu.Unlock()
	if tag == "COMMIT" && data.Err == nil {
		c.committed(ids...)
	}
}

// writers is how many goroutines produce commits from, each waiting for
// its commit before the next: a service's request handlers. Where they
// cannot keep the rate, the run is longer and its rate lower (reported as
// events/s) rather than a backlog that measures the machine's queue.
const writers = 8

// produce commits rate events/s for secs seconds, one per transaction,
// with send (which commits, returns when its COMMIT did, and for bare then
// publishes), from writers goroutines; it returns each event's commit time
// and the rate reached.
func produce(b *testing.B, rate, secs int, send func(ctx context.Context, id uuid.UUID) (time.Time, error)) (map[uuid.UUID]time.Time, float64) {
	b.Helper()
	ctx := context.Background()
	total := rate * secs
	var mu sync.Mutex
	committed := make(map[uuid.UUID]time.Time, total)
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	var wg sync.WaitGroup
	for wr := range writers {
		wg.Go(func() {
			for j := wr; j < total; j += writers {
				if d := time.Until(start.Add(time.Duration(j) * interval)); d > 0 {
					time.Sleep(d) // pacing the writers at rate, not a wait for state
				}
				id := uuid.New()
				at, err := send(ctx, id)
				if err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				committed[id] = at
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	reached := float64(total) / time.Since(start).Seconds()
	// Events committed in the first second are the warm-up.
	warm := start.Add(time.Second)
	for id, at := range committed {
		if at.Before(warm) {
			delete(committed, id)
		}
	}
	return committed, reached
}

// latencies waits until clock has every event of committed and returns the
// commit → handler commit times in milliseconds, sorted.
func latencies(b *testing.B, committed map[uuid.UUID]time.Time, clock *commitClock, total int) []float64 {
	b.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for clock.count() < total {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d events handled after 2 minutes", clock.count(), total)
		}
		<-tick.C
	}
	clock.mu.Lock()
	defer clock.mu.Unlock()
	lat := make([]float64, 0, len(committed))
	for id, c := range committed {
		h, ok := clock.at[id]
		if !ok {
			b.Fatalf("event %s committed, never handled", id)
		}
		lat = append(lat, float64(h.Sub(c).Microseconds())/1000)
	}
	slices.Sort(lat)
	return lat
}

const insertPayment = `INSERT INTO e2e_payments (id, amount) VALUES ($1, 1250)`

// e2eResult is one contender's run: its sorted latencies, those to its
// handlers' start (none for bare), and the rate its writers reached.
type e2eResult struct {
	lat, started []float64
	rate         float64
	producerCPU  time.Duration // PostgreSQL's, per event
}

func e2eRun(b *testing.B, name string, rate, secs int) e2eResult {
	switch name {
	case "bare":
		return e2eBare(b, rate, secs)
	default:
		return e2eOncekit(b, rate, secs, name == "logical")
	}
}

// e2eProducerApp is the application_name of the producers' connections
// (and the polling relay's, which shares their pool): with the logical
// relay's replication connection, the producer side whose PostgreSQL CPU
// producerCPU measures.
const e2eProducerApp = "e2e_producer"

// producerCPU is the CPU the producer side's PostgreSQL backends have used
// so far: the producers' and relays' connections, and the logical relay's
// WAL sender (which decodes).
func (w *e2eWorld) producerCPU() time.Duration {
	var total time.Duration
	for _, app := range []string{e2eProducerApp, "oncekit-logical-relay"} {
		cpu, _ := backendCPU(context.Background(), w.db.Pool, app)
		total += cpu
	}
	return total
}

// e2eBare runs the bare contender.
func e2eBare(b *testing.B, rate, secs int) e2eResult {
	b.Helper()
	w := newE2EWorld(b)
	defer w.close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cons, err := w.nats.JS.CreateOrUpdateConsumer(ctx, w.stream, jetstream.ConsumerConfig{Durable: "bare", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		b.Fatal(err)
	}
	msgs := make(chan jetstream.Msg, 512)
	cc, err := cons.Consume(func(m jetstream.Msg) { msgs <- m })
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Stop()
	var workers sync.WaitGroup
	defer workers.Wait()
	defer cancel()
	for range 4 {
		workers.Go(func() {
			for {
				var m jetstream.Msg
				select {
				case m = <-msgs:
				case <-ctx.Done():
					return
				}
				id, err := uuid.Parse(m.Headers().Get(nats.MsgIdHdr))
				if err != nil {
					b.Error(err)
					return
				}
				if _, err := w.cons.Exec(ctx, `INSERT INTO e2e_ledger (id) VALUES ($1)`, id); err != nil {
					if ctx.Err() == nil {
						b.Error(err)
					}
					return
				}
				w.handled.committed(id)
				_ = m.Ack()
			}
		})
	}
	cpu0 := w.producerCPU()
	committed, reached := produce(b, rate, secs, func(ctx context.Context, id uuid.UUID) (time.Time, error) {
		if _, err := w.prod.Exec(ctx, insertPayment, id); err != nil {
			return time.Time{}, err
		}
		at := time.Now()
		_, err := w.nats.JS.PublishMsg(ctx, &nats.Msg{Subject: w.stream, Data: payload256,
			Header: nats.Header{nats.MsgIdHdr: []string{id.String()}}})
		return at, err
	})
	lat := latencies(b, committed, w.handled, rate*secs)
	return e2eResult{lat: lat, rate: reached, producerCPU: (w.producerCPU() - cpu0) / time.Duration(rate*secs)}
}

// e2eOncekit runs oncekit as the README deploys it, with the polling relay
// or (logical) the LogicalRelay, and returns its sorted latencies, those to
// its handlers' start, and the rate its writers reached.
func e2eOncekit(b *testing.B, rate, secs int, logical bool) e2eResult {
	b.Helper()
	w := newE2EWorld(b)
	defer w.close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ob, err := outbox.New(&outbox.Config{Schema: w.db.Schema, Logical: logical})
	if err != nil {
		b.Fatal(err)
	}
	pub, err := natsjs.NewPublisher(w.nats.Conn, nil)
	if err != nil {
		b.Fatal(err)
	}
	var relay interface{ Run(context.Context) error }
	if logical {
		if err := ob.SetUpLogical(ctx, w.prod); err != nil {
			b.Fatal(err)
		}
		defer dropSlot(w.db, "oncekit_"+w.db.Schema)
		relay, err = outbox.NewLogicalRelay(w.prod, ob, pub, &outbox.LogicalRelayConfig{Logger: relayBenchLogger()})
	} else {
		relay, err = outbox.NewRelay(w.prod, ob, pub, &outbox.RelayConfig{Logger: relayBenchLogger()})
	}
	if err != nil {
		b.Fatal(err)
	}
	src, err := natsjs.NewSource(ctx, w.nats.JS, &natsjs.SourceConfig{Stream: w.stream, Durable: "ledger"})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	c, err := inbox.NewConsumer(w.cons, src, inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		w.started.committed(m.ID) // its handler's start
		w.handled.wrote(tx.Conn(), m.ID)
		_, err := tx.Exec(ctx, `INSERT INTO e2e_ledger (id) VALUES ($1)`, m.ID)
		return err
	}), &inbox.Config{Name: "ledger", Schema: w.db.Schema, Logger: relayBenchLogger(), BatchSize: e2eBatch})
	if err != nil {
		b.Fatal(err)
	}
	var run sync.WaitGroup
	defer run.Wait()
	defer cancel()
	run.Go(func() { _ = relay.Run(ctx) })
	run.Go(func() { _ = c.Run(ctx) })
	// The clock starts once the relay holds its partitions.
	(&relayWorld{pool: w.db.Pool}).waitLeases(b, outbox.DefaultPartitions, 30*time.Second)
	cpu0 := w.producerCPU()
	committed, reached := produce(b, rate, secs, func(ctx context.Context, id uuid.UUID) (time.Time, error) {
		err := pgx.BeginFunc(ctx, w.prod, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, insertPayment, id); err != nil {
				return err
			}
			_, err := ob.Enqueue(ctx, tx, broker.Message{ID: id, Subject: w.stream, Payload: payload256})
			return err
		})
		return time.Now(), err
	})
	lat := latencies(b, committed, w.handled, rate*secs)
	return e2eResult{lat: lat, started: latencies(b, committed, w.started, rate*secs), rate: reached,
		producerCPU: (w.producerCPU() - cpu0) / time.Duration(rate*secs)}
}

// e2eBatch is the oncekit contenders' inbox.Config.BatchSize:
// ONCEKIT_BENCH_E2E_BATCH, or 100 as the README's quickstart sets it.
var e2eBatch = envInt("ONCEKIT_BENCH_E2E_BATCH", 100)

// dropSlot drops a run's slot once its relay has stopped: a slot left
// behind holds the cluster's WAL.
func dropSlot(db *testenv.DB, slot string) {
	_, _ = db.Pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, slot)
}

// e2eCluster is BenchmarkLatencyE2E's PostgreSQL cluster: wal_level =
// logical, otherwise as a local server ships (fsync and synchronous commit
// on), started at its first use and stopped by TestMain.
var e2eCluster struct {
	once sync.Once
	pg   *pgcluster.Cluster
	err  error
}

const e2eClusterSettings = `
wal_level = logical
max_replication_slots = 20
max_wal_senders = 20
max_connections = 200
shared_buffers = 256MB
`

func e2eURL(b testing.TB) string {
	b.Helper()
	e2eCluster.once.Do(func() {
		dir, err := os.MkdirTemp("", "oncekit-e2e-log-")
		if err != nil {
			e2eCluster.err = err
			return
		}
		e2eCluster.pg, e2eCluster.err = pgcluster.Start(context.Background(), pgcluster.Options{LogDir: dir, Settings: e2eClusterSettings})
	})
	if e2eCluster.err != nil {
		b.Fatalf("a PostgreSQL cluster with wal_level=logical: %v", e2eCluster.err)
	}
	return e2eCluster.pg.URL("postgres")
}

func stopE2ECluster() {
	if e2eCluster.pg != nil {
		e2eCluster.pg.Close()
	}
}

// payload256 is every event's payload: 256 bytes, as the relay's benchmarks
// send.
var payload256 = []byte(strings.Repeat("x", 256))
