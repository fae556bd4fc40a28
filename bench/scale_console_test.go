package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncekit/oncekit/console"
	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// fillDead adds dead letters of consumer "bench" over 30 days, replayed
// but the newest 100, which wait for a replay: what waits is the day's
// trouble, whatever the history holds.
const fillDead = `
INSERT INTO dead_letters (consumer, message_id, subject, payload, reason, attempts, created_at, replayed_at)
SELECT 'bench', gen_random_uuid()::text, 'scale.history', decode(repeat(md5(g::text), 4), 'hex'),
	'handler: order ' || g || ' refused: ' || (ARRAY['card declined', 'account closed', 'timeout'])[1 + g % 3], 5,
	t.at, CASE WHEN g < {rows} - 100 THEN t.at + interval '1 hour' END
FROM generate_series($1::bigint, $2::bigint - 1) g,
	LATERAL (SELECT now() - interval '30 days' + g * (interval '30 days' / {rows}) AS at) t`

// fillAudit adds a year of operators' actions.
const fillAudit = `
INSERT INTO console_audit (at, operator, action, target, count, note)
SELECT now() - interval '365 days' + g * (interval '365 days' / {rows}), 'ana', 'effects.resolve', 'effect ' || g, 1, 'scale'
FROM generate_series($1::bigint, $2::bigint - 1) g`

// consoleTables are the tables BenchmarkScaleConsole fills, with their
// fills (BenchmarkScale's where it has one).
var consoleTables = []struct{ table, fill, after string }{
	{"outbox", fillOutbox, publishOutbox},
	{"processed_messages", fillClaims, "SELECT"},
	{"side_effects", fillEffects, "SELECT"},
	{"idempotency_keys", fillKeys, "SELECT"},
	{"dead_letters", fillDead, "SELECT"},
	{"console_audit", fillAudit, "SELECT"},
}

// consoleSmall is the rows of each table of the second baseline: a
// history just long enough for every page to show what it shows at any
// size (a full audit page, the waiting dead letters, an unknown effect),
// so that x-1k is the pages' growth with the history alone.
const consoleSmall = 1000

// BenchmarkScaleConsole measures the server time of every console page
// (the handler's, without the network) on a schema whose every table holds
// each row count of ONCEKIT_SCALE_ROWS in turn, paired with the same page
// on a fresh empty schema just before: BenchmarkScaleConsole/<page>/rows=<n>
// reports ms (the median of ONCEKIT_SCALE_CONSOLE_N requests, default 30),
// x-empty (over the empty schema's median: it includes the cost of a page
// that lists rows over one that lists none) and x-1k (over a schema
// holding 1,000 rows of each table, measured in the same pair).
// ONCEKIT_SCALE_PAIRS repeats the pairs. `make bench-scale` runs it with
// BenchmarkScale.
func BenchmarkScaleConsole(b *testing.B) {
	cfg := scaleConfigFromEnv(b)
	n := edgeEnvInt("ONCEKIT_SCALE_CONSOLE_N", 30)
	db := testenv.NewDB(b)
	filled := 0
	for _, rows := range cfg.rows {
		if rows > filled {
			for _, t := range consoleTables {
				fill(b, db, t.table, t.fill, filled, rows, cfg.rows[len(cfg.rows)-1], t.after)
			}
			filled = rows
		}
		for range cfg.pairs {
			empty := testenv.NewDB(b)
			emptyTimes := consolePageTimes(b, empty, n)
			empty.Close()
			small := testenv.NewDB(b)
			for _, t := range consoleTables {
				fill(b, small, t.table, t.fill, 0, consoleSmall, consoleSmall, t.after)
			}
			smallTimes := consolePageTimes(b, small, n)
			small.Close()
			times := emptyTimes
			if rows > 0 {
				times = consolePageTimes(b, db, n)
			}
			for _, page := range consolePages {
				b.Run(page.name+"/rows="+strconv.Itoa(rows), func(b *testing.B) {
					b.ReportMetric(median(times[page.name]), "ms")
					b.ReportMetric(median(times[page.name])/median(emptyTimes[page.name]), "x-empty")
					b.ReportMetric(median(times[page.name])/median(smallTimes[page.name]), "x-1k")
				})
			}
		}
	}
	db.Close()
}

// consolePages are the pages measured, with what each looks up; "{id}"
// and "{key}" stand for an identifier the schema holds (on the filled one)
// or not (on the empty one).
var consolePages = []struct{ name, path string }{
	{"overview", "/"},
	{"chain", "/chain?q={id}"},
	{"chain-key", "/chain?q={key}&tenant=&operation=bench-create"},
	{"outbox", "/outbox"},
	{"inbox", "/inbox"},
	{"dead-letter", "/inbox/dead/{dead}"},
	{"effects", "/effects"},
	{"edge", "/edge"},
	{"edge-record", "/edge/record?tenant=&operation=bench-create&stored_key={stored}"},
	{"drift", "/drift?run=1"},
	{"audit", "/audit"},
	{"audit-older", "/audit?before={audit}"},
}

// consolePageTimes serves the console of db and times n requests of every
// page, in turns, returning each page's times in milliseconds.
func consolePageTimes(b *testing.B, db *testenv.DB, n int) map[string][]float64 {
	b.Helper()
	ctx := context.Background()
	con, err := console.New(db.Pool, &console.Config{Schema: db.Schema, Logger: relayBenchLogger()})
	if err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	var last time.Duration
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		con.ServeHTTP(w, r)
		mu.Lock()
		last = time.Since(start)
		mu.Unlock()
	}))
	defer srv.Close()
	// Identifiers from the middle of the history, so that a lookup finds
	// what it looks for ("" where the table is empty).
	var id, key, dead, audit string
	_ = db.Pool.QueryRow(ctx, `SELECT coalesce((SELECT id::text FROM outbox WHERE seq = (SELECT (min(seq) + max(seq)) / 2 FROM outbox)), 'none')`).Scan(&id)
	_ = db.Pool.QueryRow(ctx, `SELECT coalesce((SELECT max(id)::text FROM dead_letters), '1'), coalesce((SELECT (max(id) / 2)::text FROM console_audit), '1')`).Scan(&dead, &audit)
	key = "scale-key"
	stored := idempotency.StoredKey(key)
	_ = db.Pool.QueryRow(ctx, `SELECT coalesce((SELECT key FROM idempotency_keys WHERE operation = 'bench-create' LIMIT 1), $1)`, stored).Scan(&stored)
	replace := map[string]string{"{id}": url.QueryEscape(id), "{key}": key, "{dead}": dead, "{stored}": stored, "{audit}": audit}
	times := map[string][]float64{}
	for i := range n + 1 {
		for _, page := range consolePages {
			path := page.path
			for k, v := range replace {
				path = strings.ReplaceAll(path, k, v)
			}
			resp, err := http.Get(srv.URL + path)
			if err != nil {
				b.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusNotFound {
				b.Fatalf("%s: %s", path, resp.Status)
			}
			if i == 0 {
				continue // warm-up: statements prepared, pages parsed
			}
			mu.Lock()
			times[page.name] = append(times[page.name], float64(last.Microseconds())/1000)
			mu.Unlock()
		}
	}
	return times
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}
