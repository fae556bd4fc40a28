package bench

import (
	"bytes"
	"cmp"
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/retention"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/sideeffect"
)

// scaleTable is one table BenchmarkScale fills, the hot paths that touch
// it, and its retention.
type scaleTable struct {
	table string
	fill  string   // fill statement ($1, $2: rows from, to)
	after []string // statements run after each fill
	paths []scalePath
	// retain returns the table's retention pass on db: it deletes every
	// row older than age, as the table's own retention loop does with
	// that retention, and returns how many.
	retain func(b *testing.B, db *testenv.DB, age time.Duration) func(ctx context.Context) (int64, error)
	// oldest and retained are the ages of the fill's first and last rows
	// when filled; retained is the table's default retention. Zero for a
	// table whose rows expire at a time set when written (the edge's):
	// its retention has no age to take in parts (ignores age), and its
	// passes are parted by time.
	oldest, retained time.Duration
}

// scalePath is one hot path: measure does n units of its work on the tables
// of db and returns the figure.
type scalePath struct {
	name    string
	unit    string // the rate's unit
	rate    bool   // the rate is a figure (false: the path offers a fixed rate, its latency is the figure)
	n       int
	measure func(b *testing.B, db *testenv.DB, n int) figure
}

// report reports f as p's figures.
func (p scalePath) report(b *testing.B, f figure) {
	if p.rate {
		b.ReportMetric(f.rate(), p.unit)
	}
	if len(f.lat) > 0 {
		b.ReportMetric(f.pct(0.50), "p50-ms")
		b.ReportMetric(f.pct(0.99), "p99-ms")
	}
	b.ReportMetric(0, "ns/op")
}

func scaleTables(cfg scaleConfig) []scaleTable {
	quarter := max(cfg.n/4, 100)
	return []scaleTable{{
		table: "outbox", fill: fillOutbox, after: []string{publishOutbox},
		paths: []scalePath{
			{name: "relay-drain", unit: "msgs/s", rate: true, n: cfg.n, measure: scaleRelayDrain},
			{name: "commit-ack", unit: "events/s", n: 1000 * cfg.seconds, measure: func(b *testing.B, db *testenv.DB, n int) figure {
				return scaleCommitAck(b, db, cfg.seconds)
			}},
		},
		oldest: 48 * time.Hour, retained: 24 * time.Hour,
		retain: func(b *testing.B, db *testenv.DB, age time.Duration) func(ctx context.Context) (int64, error) {
			ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
			if err != nil {
				b.Fatal(err)
			}
			r, err := outbox.NewRelay(db.Pool, ob, ackAll{}, &outbox.RelayConfig{Logger: relayBenchLogger(),
				Retention: age, RetentionRate: cfg.retentionRate})
			if err != nil {
				b.Fatal(err)
			}
			return r.Prune
		},
	}, {
		table: "processed_messages", fill: fillClaims,
		paths:  []scalePath{{name: "consume", unit: "msgs/s", rate: true, n: cfg.n, measure: scaleConsume}},
		oldest: 14 * 24 * time.Hour, retained: 7 * 24 * time.Hour,
		retain: func(b *testing.B, db *testenv.DB, age time.Duration) func(ctx context.Context) (int64, error) {
			s, err := inbox.NewStore(db.Schema)
			if err != nil {
				b.Fatal(err)
			}
			// What Consumer.Prune does with the default Config.
			q := retention.Spaced(db.Pool, retention.Spacing(cmp.Or(cfg.retentionRate, retention.DefaultRate), 1000))
			return func(ctx context.Context) (int64, error) {
				return s.PruneClaims(ctx, q, "bench", time.Now().Add(-age), 1000)
			}
		},
	}, {
		table: "side_effects", fill: fillEffects,
		paths:  []scalePath{{name: "dispatch", unit: "effects/s", rate: true, n: quarter, measure: scaleDispatch}},
		oldest: 60 * 24 * time.Hour, retained: 30 * 24 * time.Hour,
		retain: func(b *testing.B, db *testenv.DB, age time.Duration) func(ctx context.Context) (int64, error) {
			l, err := sideeffect.New(&sideeffect.Config{Schema: db.Schema})
			if err != nil {
				b.Fatal(err)
			}
			// What the dispatcher's retention does with its defaults.
			q := retention.Spaced(db.Pool, retention.Spacing(cmp.Or(cfg.retentionRate, retention.DefaultRate), 1000))
			return func(ctx context.Context) (int64, error) {
				return l.Prune(ctx, q, time.Now().Add(-age), 1000)
			}
		},
	}, {
		table: "idempotency_keys", fill: fillKeys,
		paths: []scalePath{
			{name: "edge-first", unit: "req/s", rate: true, n: quarter, measure: scaleEdge(false)},
			{name: "edge-replay", unit: "req/s", rate: true, n: quarter, measure: scaleEdge(true)},
		},
		retain: func(b *testing.B, db *testenv.DB, _ time.Duration) func(ctx context.Context) (int64, error) {
			e, err := idempotency.New(db.Pool, &idempotency.Config{Schema: db.Schema, RetentionRate: cfg.retentionRate})
			if err != nil {
				b.Fatal(err)
			}
			return e.Prune
		},
	}}
}

// scaleRelayDrain drains n events, enqueued just before (untimed), with a
// relay on db.
func scaleRelayDrain(b *testing.B, db *testenv.DB, n int) figure {
	w := newRelayWorldOn(b, db)
	defer w.nats.Close()
	defer w.pool.Close()
	took := drainOncekit(b, w, relayEvents(w.subject+".x", n))
	return figure{units: n, elapsed: took}
}

// scaleCommitAck commits 1,000 events/s for secs seconds with a relay on db
// and returns their commit → JetStream store latencies.
func scaleCommitAck(b *testing.B, db *testenv.DB, secs int) figure {
	w := newRelayWorldOn(b, db)
	defer w.nats.Close()
	defer w.pool.Close()
	lat := relayLatencyOn(b, w, 1000, secs, false)
	return figure{units: len(lat), elapsed: time.Duration(secs-1) * time.Second, lat: lat}
}

// scaleConsume consumes n messages, published just before (untimed), with
// the batch consumer (claims on) on db, its own retention off.
func scaleConsume(b *testing.B, db *testenv.DB, n int) figure {
	env := newConsumeEnvOn(b, db, n, 0)
	env.retention = -1
	start := time.Now()
	env.runOncekit(b, consumeBatch, false, false)
	f := figure{units: n, elapsed: time.Since(start)}
	env.check(b)
	env.close()
	return f
}

// scaleDispatch confirms n effects, recorded just before (untimed), with a
// dispatcher on db against a local webhook receiver.
func scaleDispatch(b *testing.B, db *testenv.DB, n int) figure {
	srv := newDispatchProvider(b)
	defer srv.release()
	from := recordEffects(b, db, "scale-"+uuid.NewString()[:8], n, bytes.Repeat([]byte("x"), 256))
	pass := dispatchEffects(b, db, srv, from, n, envInt("ONCEKIT_BENCH_CONCURRENCY", 64), false, func() {})
	return figure{units: n, elapsed: pass.elapsed}
}

// scaleEdge returns the edge's measurement on db: first requests (fresh
// keys), or one replay each of n keys completed just before (untimed).
//
// The route waits up to 2 s (Route.Waiting) where BenchmarkEdge's answers
// 409 at once: the claim's lock_timeout (1 ms without Waiting) bounds every lock
// the claim statement waits for, not only a holder's row lock, and on a
// loaded machine a first request with a fresh key met it (PostgreSQL's log
// showed lock timeouts with no tuple in their context, as a wait to extend
// the table or an index gives) and was answered 409.
func scaleEdge(replay bool) func(b *testing.B, db *testenv.DB, n int) figure {
	return func(b *testing.B, db *testenv.DB, n int) figure {
		const conc = 4
		env := newEdgeEnvOn(b, db, conc, &idempotency.Waiting{For: 2 * time.Second})
		defer env.close()
		prefix := uuid.NewString()
		key := func(j int) string { return prefix + "-" + strconv.Itoa(j) }
		if replay {
			env.run(b, n, conc, env.mwURL, key)
		}
		return env.timed(b, n, conc, env.mwURL, key)
	}
}
