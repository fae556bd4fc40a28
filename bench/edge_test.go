package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// BenchmarkEdge measures the HTTP idempotency middleware in SameTx mode on
// real HTTP over loopback and a real PostgreSQL, next to the same handler
// without the middleware, in one run:
//
//   - new-key: every request carries a fresh key (claim, handler, store+commit);
//   - replay:  every request repeats a completed key (the stored response);
//   - bare:    the same handler, its own BEGIN … COMMIT, no middleware.
//
// One iteration is one whole measurement of ONCEKIT_BENCH_EDGE_N requests
// (default 5000) from ONCEKIT_BENCH_EDGE_CONC concurrent clients (default 4).
// Reported: req/s, p50-ms, p99-ms and pg-rt/req (PostgreSQL round trips per
// request, counted on the wire).
func BenchmarkEdge(b *testing.B) {
	n := edgeEnvInt("ONCEKIT_BENCH_EDGE_N", edgeEnvInt("ONCEKIT_BENCH_N", 5000))
	conc := edgeEnvInt("ONCEKIT_BENCH_EDGE_CONC", 4)
	env := newEdgeEnv(b, conc)
	b.Run("new-key", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			prefix := uuid.NewString()
			env.measure(b, n, conc, env.mwURL, func(j int) string { return prefix + "-" + strconv.Itoa(j) })
		}
	})
	b.Run("replay", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			// Keys completed beforehand (not measured), then replayed.
			prefix := uuid.NewString()
			keys := min(n, 500)
			key := func(j int) string { return prefix + "-" + strconv.Itoa(j%keys) }
			env.run(b, keys, conc, env.mwURL, key)
			env.measure(b, n, conc, env.mwURL, key)
		}
	})
	b.Run("bare", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			env.measure(b, n, conc, env.bareURL, func(int) string { return "" })
		}
	})
}

type edgeEnv struct {
	client         *http.Client
	mwURL, bareURL string
	trips          atomic.Int64
	closers        []func()
	closeOnce      sync.Once
}

// close releases the env's servers, client and pool now rather than when
// the benchmark ends; it is idempotent.
func (env *edgeEnv) close() {
	env.closeOnce.Do(func() {
		for _, c := range slices.Backward(env.closers) {
			c()
		}
	})
}

func newEdgeEnv(b *testing.B, conc int) *edgeEnv {
	return newEdgeEnvOn(b, testenv.NewDB(b), conc, nil)
}

// newEdgeEnvOn is newEdgeEnv on the tables of db, which may already hold
// records, with the route's Waiting set to waiting: servers and a pool of its
// own, released when the benchmark ends.
func newEdgeEnvOn(b *testing.B, db *testenv.DB, conc int, waiting *idempotency.Waiting) *edgeEnv {
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_payments (id uuid PRIMARY KEY, amount bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	env := &edgeEnv{}
	b.Cleanup(env.close)
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = int32(max(conc, 4))
	cfg.ConnConfig.DialFunc = edgeCountingDialer(&env.trips)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	env.closers = append(env.closers, pool.Close)
	edge, err := idempotency.New(pool, &idempotency.Config{Schema: db.Schema})
	if err != nil {
		b.Fatal(err)
	}
	mw, err := edge.Route(&idempotency.Route{Operation: "bench-create", Mode: idempotency.SameTx, Waiting: waiting, SharedScope: true})
	if err != nil {
		b.Fatal(err)
	}
	const insert = `INSERT INTO bench_payments (id, amount) VALUES ($1, $2)`
	const body = `{"id":%q,"amount":100,"currency":"EUR"}`
	wrapped := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.Tx(r)
		info, _ := idempotency.FromRequest(r)
		id := info.ID()
		if _, err := tx.Exec(r.Context(), insert, id, 100); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/payments/"+id.String())
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, body, id)
	}))
	bare := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := uuid.New()
		tx, err := pool.Begin(r.Context())
		if err == nil {
			if _, err = tx.Exec(r.Context(), insert, id, 100); err == nil {
				err = tx.Commit(r.Context())
			}
			_ = tx.Rollback(context.WithoutCancel(r.Context()))
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/payments/"+id.String())
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, body, id)
	})
	mwSrv, bareSrv := httptest.NewServer(wrapped), httptest.NewServer(bare)
	env.closers = append(env.closers, mwSrv.Close, bareSrv.Close)
	env.mwURL, env.bareURL = mwSrv.URL, bareSrv.URL
	env.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc, MaxConnsPerHost: conc}}
	env.closers = append(env.closers, env.client.CloseIdleConnections)
	// Warm connections and statement caches on both sides.
	warm := uuid.NewString()
	env.run(b, 4*conc, conc, env.mwURL, func(j int) string { return warm + strconv.Itoa(j) })
	env.run(b, 4*conc, conc, env.mwURL, func(j int) string { return warm + strconv.Itoa(j) })
	env.run(b, 4*conc, conc, env.bareURL, func(int) string { return "" })
	return env
}

// run sends n requests from conc clients and returns each one's latency.
func (env *edgeEnv) run(b *testing.B, n, conc int, url string, key func(int) string) []time.Duration {
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				j := int(next.Add(1)) - 1
				if j >= n {
					return
				}
				req, _ := http.NewRequest(http.MethodPost, url+"/payments", strings.NewReader(`{"amount":100,"currency":"EUR"}`))
				req.Header.Set("Content-Type", "application/json")
				if k := key(j); k != "" {
					req.Header.Set(idempotency.HeaderKey, k)
				}
				start := time.Now()
				resp, err := env.client.Do(req)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					if resp.StatusCode != http.StatusCreated {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				lat[j] = time.Since(start)
				if err != nil {
					failed.Store(err)
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	return lat
}

// measure runs one measurement and reports it.
func (env *edgeEnv) measure(b *testing.B, n, conc int, url string, key func(int) string) {
	trips := env.trips.Load()
	f := env.timed(b, n, conc, url, key)
	trips = env.trips.Load() - trips
	b.ReportMetric(f.rate(), "req/s")
	b.ReportMetric(f.pct(0.50), "p50-ms")
	b.ReportMetric(f.pct(0.99), "p99-ms")
	b.ReportMetric(float64(trips)/float64(n), "pg-rt/req")
	b.ReportMetric(0, "ns/op")
}

// timed sends n requests from conc clients and returns the figure.
func (env *edgeEnv) timed(b *testing.B, n, conc int, url string, key func(int) string) figure {
	start := time.Now()
	lat := env.run(b, n, conc, url, key)
	f := figure{units: n, elapsed: time.Since(start), lat: make([]float64, len(lat))}
	for i, d := range lat {
		f.lat[i] = float64(d) / float64(time.Millisecond)
	}
	return f
}

func edgeEnvInt(name string, def int) int {
	if v, err := strconv.Atoi(getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
