package fleet_test

import (
	"context"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/migrations"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/outbox/fleet"
)

// newDatabase creates a database of the test's own on DatabaseURL's server,
// with the migrations applied in schema oncekit, dropped at the test's end,
// and returns a pool on it and its URL.
func newDatabase(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	name := testenv.Name(t)
	admin, err := pgx.Connect(ctx, testenv.DatabaseURL())
	require.NoError(t, err)
	defer func() { _ = admin.Close(ctx) }()
	_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, testenv.DatabaseURL())
		if err != nil {
			return
		}
		defer func() { _ = c.Close(ctx) }()
		_, _ = c.Exec(ctx, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	u, err := url.Parse(testenv.DatabaseURL())
	require.NoError(t, err)
	u.Path = "/" + name
	pool, err := pgxpool.New(ctx, u.String())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = migrations.Up(ctx, pool, migrations.WithSchema("oncekit"))
	require.NoError(t, err)
	return u.String(), pool
}

// through returns rawURL with its host replaced by addr.
func through(t *testing.T, rawURL, addr string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	u.Host = addr
	return u.String()
}

// One member serves four databases: a healthy one, one in a database of
// its own reached through a proxy the test cuts mid-run, one at a closed
// port (refusing connections) and one whose server accepts connections and
// never answers. The broken ones are backed off and counted, each on its
// own; the healthy one's events keep flowing with their usual latency.
func TestADatabaseDownDelaysNoOther(t *testing.T) {
	testenv.RequireDirect(t, "creates a database of its own")
	t.Parallel()
	w := newWorld(t)
	healthy := newOutboxDB(t, "healthy")
	cutURL, cutPool := newDatabase(t)
	proxy := testenv.StartProxy(t, must(url.Parse(cutURL)).Host)
	ob, err := outbox.New(nil)
	require.NoError(t, err)
	cut := &outboxDB{db: &testenv.DB{Pool: cutPool}, ob: ob,
		def: fleet.Database{Name: "cut", URL: through(t, cutURL, proxy.Addr)}}
	refused := fleet.Database{Name: "refused", URL: through(t, cutURL, testenv.FreeAddr(t))}
	hung := fleet.Database{Name: "hung", URL: through(t, cutURL, testenv.StartBlackhole(t))}

	cfg := w.config("m1")
	// A connection attempt to the hung database lasts this long: a
	// database that held another up would show it in the healthy one's
	// latency.
	cfg.ConnectTimeout = 30 * time.Second
	m := w.start(t, cfg, healthy.def, cut.def, refused, hung)
	w.pub.waitPublished(t, append(w.enqueue(t, healthy, "h", 5), w.enqueue(t, cut, "c", 5)...), 60*time.Second)
	before := latencies(t, w, healthy, 20)

	proxy.Cut()
	stranded := w.enqueue(t, cut, "c", 5) // committed, its relay cut off
	during := latencies(t, w, healthy, 40)

	failures := func(db string) float64 {
		return testenv.Metric(t, m.reg, "oncekit_fleet_database_failures_total", "database", db)
	}
	require.Eventually(t, func() bool {
		return failures("refused") >= 2 && failures("hung") >= 1 && failures("cut") >= 1 &&
			testenv.Metric(t, m.reg, "oncekit_fleet_database_up", "database", "cut") == 0
	}, 90*time.Second, 50*time.Millisecond, "the broken databases counted and reported down")
	require.Equal(t, 1.0, testenv.Metric(t, m.reg, "oncekit_fleet_database_up", "database", "healthy"))
	require.Zero(t, testenv.Metric(t, m.reg, "oncekit_fleet_database_failures_total", "database", "healthy"))
	require.Zero(t, w.pub.published(stranded))
	during = append(during, latencies(t, w, healthy, 20)...) // while they are backed off

	p99 := func(ds []time.Duration) time.Duration {
		slices.Sort(ds)
		return ds[len(ds)*99/100]
	}
	t.Logf("healthy commit-to-publish p99: %v before the faults, %v during them (%d events)", p99(before), p99(during), len(during))
	// On a shared machine the latency moves with its load (tens of ms when
	// quiet, seconds when not); a database held up behind the hung one
	// would wait out its 30s connection attempts, the first of which is
	// pending while the healthy one's events are measured.
	require.Less(t, p99(during), cfg.ConnectTimeout/2, "the healthy database's events are not held up")
}

// latencies commits n events into d, one every 20ms, waits until all are
// published and returns each one's time from commit to acknowledgement.
func latencies(t *testing.T, w *world, d *outboxDB, n int) []time.Duration {
	t.Helper()
	var msgs []broker.Message
	committed := map[string]time.Time{}
	for range n {
		m := w.enqueue(t, d, "lat", 1)
		committed[m[0].ID.String()] = time.Now()
		msgs = append(msgs, m...)
		<-time.After(20 * time.Millisecond) // the writer's pace
	}
	w.pub.waitPublished(t, msgs, 60*time.Second)
	w.pub.mu.Lock()
	defer w.pub.mu.Unlock()
	out := make([]time.Duration, 0, n)
	for _, m := range msgs {
		out = append(out, max(w.pub.first[m.ID].Sub(committed[m.ID.String()]), 0))
	}
	return out
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
