package bench

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oncekit/oncekit/internal/retention"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// BenchmarkScale measures how each hot path's cost grows with the rows its
// table retains: for every table (outbox, processed_messages, side_effects,
// idempotency_keys) it fills one schema, in bulk, to each row count of
// ONCEKIT_SCALE_ROWS in turn (default 0,1000000,10000000; see the fill
// statements), and at each count runs every hot path of that table twice in
// a row: on a fresh empty schema, then on the filled one. Lines are
// BenchmarkScale/<path>/rows=<count>, with the path's rate (or latency) on
// the filled tables and x-empty, its rate over the paired empty run's
// (p99-x-empty for latencies). ONCEKIT_SCALE_PAIRS (default 3) repeats
// these pairs on the same fill (go test names the repeats #01, #02…), so
// that one fill yields a median of several pairs. Then, on the largest fill,
// the table's retention deletes the whole backlog while its first hot path
// runs paced at 80% of its empty rate (BenchmarkScale/<table>-retention/rows=<count>:
// deleted rows/s, and the hot path's rate and p99 during the deletion over
// the same paced run just before it without retention). It does so in
// ONCEKIT_SCALE_RETENTION_PASSES (default 5) passes, each with its own
// paced run before it: pass k of n deletes the rows older than the age k/n
// of the way from the fill's oldest row to the table's retention, so that
// the last deletes the rest at the default retention, and each is one
// paired measurement of the same backlog's deletion (the edge's records
// expire at a time set when written: its passes are parted by time).
//
// ONCEKIT_SCALE_N (default 20,000) is the messages of one relay or consumer
// measurement, a quarter of it the effects or requests of one dispatcher or
// edge measurement; ONCEKIT_SCALE_SECONDS (default 5) the length of a
// latency run and of the paced run without retention; ONCEKIT_SCALE_TABLES
// picks tables (comma-separated, default all); ONCEKIT_SCALE_RETENTION_MAX
// (default 300) bounds a retention run, in seconds;
// ONCEKIT_SCALE_RETENTION_RATE sets the retention runs' RetentionRate
// (default: the components' default; negative: no limit). Run it with `make
// bench-scale`; `make bench` leaves it out.
func BenchmarkScale(b *testing.B) {
	cfg := scaleConfigFromEnv(b)
	printServer(b)
	for _, t := range scaleTables(cfg) {
		if !cfg.wants(t.table) {
			continue
		}
		db := testenv.NewDB(b)
		filled, filledAt := 0, time.Time{}
		var last map[string]figure // the empty figures paired with the largest fill
		for _, rows := range cfg.rows {
			if rows > filled {
				fill(b, db, t.table, t.fill, filled, rows, cfg.rows[len(cfg.rows)-1], t.after...)
				filled, filledAt = rows, time.Now()
			}
			last = map[string]figure{}
			for range cfg.pairs {
				for _, p := range t.paths {
					b.Run(p.name+"/rows="+strconv.Itoa(rows), func(b *testing.B) {
						for range b.N {
							last[p.name] = scaleMeasure(b, p, db, rows)
						}
					})
				}
			}
		}
		if filled > 0 && t.retain != nil {
			// The backlog's pages were last written long before, as a
			// deployment's are when retention comes for them: each pass pays
			// a full-page image for the first change to each.
			checkpoint(b, db.Pool)
			rate := cmp.Or(cfg.retentionRate, retention.DefaultRate)
			passes := cfg.retentionPasses
			if t.oldest == 0 && rate < 0 {
				passes = 1 // no age to part by, and no rate to part the time by
			}
			for k := 1; k <= passes; k++ {
				// The age of the k-th part's boundary now, the rows having aged
				// since the fill; the last pass takes the table's retention.
				age := t.oldest - (t.oldest-t.retained)*time.Duration(k)/time.Duration(passes) + time.Since(filledAt)
				if k == passes {
					age = t.retained
				}
				b.Run(t.table+"-retention/rows="+strconv.Itoa(filled), func(b *testing.B) {
					for range b.N {
						retain := t.retain(b, db, age)
						if t.oldest == 0 && k < passes {
							retain = stopAfter(retain, time.Duration(float64(filled)/float64(passes)/float64(rate)*float64(time.Second)))
						}
						retentionUnderLoad(b, cfg, t.paths[0], retain, db, last[t.paths[0].name])
					}
				})
			}
		}
		db.Close()
	}
}

// scaleMeasure runs path p on a fresh empty schema and, when rows > 0, on db
// just after, reports the figures, and returns the empty one.
func scaleMeasure(b *testing.B, p scalePath, db *testenv.DB, rows int) figure {
	b.Helper()
	empty := testenv.NewDB(b)
	e := p.measureOn(b, empty, p.n)
	empty.Close()
	if rows == 0 {
		p.report(b, e)
		return e
	}
	f := p.measureOn(b, db, p.n)
	p.report(b, f)
	if p.rate {
		b.ReportMetric(f.rate()/e.rate(), "x-empty")
	}
	if len(f.lat) > 0 {
		b.ReportMetric(f.pct(0.99)/e.pct(0.99), "p99-x-empty")
	}
	return e
}

// scaleConfig is BenchmarkScale's configuration, from the environment.
type scaleConfig struct {
	rows            []int         // row counts to fill to, ascending
	pairs           int           // paired measurements of each path at each row count
	n               int           // messages of one relay or consumer measurement
	seconds         int           // length of a latency run and of a paced run
	tables          []string      // the tables to measure (empty: all)
	retentionMax    time.Duration // bound of one retention run
	retentionRate   int           // RetentionRate of the retention runs (0: the default)
	retentionPasses int           // passes a table's retention deletes its backlog in
}

func scaleConfigFromEnv(b *testing.B) scaleConfig {
	b.Helper()
	cfg := scaleConfig{
		n:               envInt("ONCEKIT_SCALE_N", 20_000),
		pairs:           max(1, envInt("ONCEKIT_SCALE_PAIRS", 3)),
		seconds:         envInt("ONCEKIT_SCALE_SECONDS", 5),
		retentionMax:    time.Duration(envInt("ONCEKIT_SCALE_RETENTION_MAX", 300)) * time.Second,
		retentionPasses: envInt("ONCEKIT_SCALE_RETENTION_PASSES", 5),
	}
	if r := os.Getenv("ONCEKIT_SCALE_RETENTION_RATE"); r != "" {
		n, err := strconv.Atoi(r)
		if err != nil {
			b.Fatalf("ONCEKIT_SCALE_RETENTION_RATE: %q is not a whole number", r)
		}
		cfg.retentionRate = n
	}
	for _, s := range strings.Split(cmp.Or(os.Getenv("ONCEKIT_SCALE_ROWS"), "0,1000000,10000000"), ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 {
			b.Fatalf("ONCEKIT_SCALE_ROWS: %q is not a row count", s)
		}
		cfg.rows = append(cfg.rows, n)
	}
	slices.Sort(cfg.rows)
	if t := os.Getenv("ONCEKIT_SCALE_TABLES"); t != "" {
		cfg.tables = strings.Split(t, ",")
	}
	return cfg
}

// wants reports whether table is to be measured.
func (c scaleConfig) wants(table string) bool {
	return len(c.tables) == 0 || slices.Contains(c.tables, table)
}

// figure is one measurement: units of work done in elapsed (the timed part
// only), and each unit's latency in milliseconds where the path measures it.
type figure struct {
	units   int
	elapsed time.Duration // the timed part
	total   time.Duration // the whole measurement, its untimed set-up included (see measureOn)
	lat     []float64
}

// rate is units per second of the timed part.
func (f figure) rate() float64 { return float64(f.units) / f.elapsed.Seconds() }

// capacity is units per second of the whole measurement: the rate the path
// sustains on this machine together with the work that feeds it (enqueuing
// the events a relay drains, publishing the messages a consumer takes,
// recording the effects a dispatcher fires).
func (f figure) capacity() float64 { return float64(f.units) / f.total.Seconds() }

// measureOn runs n units of p on db and returns its figure with total set.
func (p scalePath) measureOn(b *testing.B, db *testenv.DB, n int) figure {
	start := time.Now()
	f := p.measure(b, db, n)
	f.total = time.Since(start)
	return f
}

// pct is the q-quantile of the latencies (0 when none were measured).
func (f figure) pct(q float64) float64 {
	if len(f.lat) == 0 {
		return 0
	}
	s := slices.Clone(f.lat)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

// add accumulates g into f.
func (f *figure) add(g figure) {
	f.units += g.units
	f.elapsed += g.elapsed
	f.total += g.total
	f.lat = append(f.lat, g.lat...)
}

// printServer prints, as a configuration line benchsum reads, the
// PostgreSQL version and the settings that move the scale figures most.
func printServer(b *testing.B) {
	b.Helper()
	db := testenv.NewDB(b)
	defer db.Close()
	var line string
	if err := db.Pool.QueryRow(context.Background(), `SELECT format('%s, shared_buffers %s, huge_pages %s, max_wal_size %s, checkpoint_timeout %s, autovacuum %s',
		current_setting('server_version'), current_setting('shared_buffers'), current_setting('huge_pages'),
		current_setting('max_wal_size'), current_setting('checkpoint_timeout'), current_setting('autovacuum'))`).Scan(&line); err != nil {
		b.Fatal(err)
	}
	if os.Getenv(scaleServerEnv) == "throwaway" {
		line = "throwaway cluster (bench/main_test.go), " + line + ", " + hugePagesInUse()
	}
	fmt.Printf("postgres: %s\n", line)
}

// stopAfter returns retain cut off after d: a retention pass without an age
// to part its backlog by (the edge's records expire at a time set when
// written) is parted by time instead, each but the last pass taking the
// time its share of the rows takes at the retention rate. A pass cut off
// reports the rows it deleted and no error.
func stopAfter(retain func(context.Context) (int64, error), d time.Duration) func(context.Context) (int64, error) {
	return func(ctx context.Context) (int64, error) {
		cut, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		n, err := retain(cut)
		if err != nil && cut.Err() != nil && ctx.Err() == nil {
			err = nil
		}
		return n, err
	}
}
