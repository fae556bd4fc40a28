package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The scale section of a captured `make bench-scale` output: the table of
// rate against rows, retention and memory, with their verdicts.
func TestScaleSectionOfCapturedRun(t *testing.T) {
	r := parseFile(t, "testdata/scale.txt")
	var page bytes.Buffer
	if err := writeScale(&page, r, ""); err != nil {
		t.Fatal(err)
	}
	containsAll(t, "section", page.String(),
		"| hot path | figure | 0 rows | 20,000 rows | |",
		"| relay-drain | msgs/s | 20,511 | 21,006 (1.54×) | PASS |",
		"| commit-ack | p99-ms | 12.7 | 7.89 (0.84×) | PASS |",
		"| consume | msgs/s | 17,743 | 11,127 (0.602×) | MISS |",
		"| edge-first | p99-ms | 23.9 | 41.6 (0.722×) | PASS |",
		"| outbox | 20,000 | 1 | 20,000 | 66,330 | 46,153 (1.45×) | 0.812× |  |  |  | PASS |",
		"| idempotency_keys | 20,000 | 1 | 20,000 | 27,571 | 508 (0.538×) |  | 130 (3.87×) |  |  | MISS |",
		"| relay | 1,000,000 | 61.5 | 30,000 rows/s | PASS |",
		"- PostgreSQL: 15.20, shared_buffers 128MB, max_wal_size 1GB, checkpoint_timeout 5min, autovacuum off",
	)
	var sum bytes.Buffer
	writeSummary(&sum, r)
	containsAll(t, "summary", sum.String(),
		"ratio scale_consume_rows=20000_x-empty 0.6024 target>=0.8 MISS",
		"ratio scale_outbox-retention_rows=20000_deleted-rows/s 6.633e+04 target>=5e+04 PASS",
		"ratio scale_memory_relay_peak-rss-MiB 61.5 target<=200 PASS",
	)
}

// A retention in passes: each figure is the median over the passes, and the
// checkpoints are their sum.
func TestScaleRetentionInPasses(t *testing.T) {
	r, err := parse(strings.NewReader(`BenchmarkScale/relay-drain/rows=900-2 1 5000 msgs/s 1.0 x-empty
BenchmarkScale/outbox-retention/rows=900-2 1 0 checkpoints 300 deleted 52000 deleted-rows/s 0.97 hot-x 9000 hot-rate 1 hot-quiet-x
BenchmarkScale/outbox-retention/rows=900#01-2 1 1 checkpoints 310 deleted 61000 deleted-rows/s 0.85 hot-x 8000 hot-rate 0.9 hot-quiet-x
BenchmarkScale/outbox-retention/rows=900#02-2 1 1 checkpoints 290 deleted 55000 deleted-rows/s 0.93 hot-x 8500 hot-rate 0.95 hot-quiet-x
`))
	if err != nil {
		t.Fatal(err)
	}
	var page bytes.Buffer
	if err := writeScale(&page, r, ""); err != nil {
		t.Fatal(err)
	}
	containsAll(t, "section", page.String(), "| outbox | 900 | 3 | 300 | 55,000 | 8,500 (0.93×) |  |  | 0.95× of the pace | 2 | PASS |",
		"Runs: 1 paired measurement of each hot path")
	var sum bytes.Buffer
	writeSummary(&sum, r)
	containsAll(t, "summary", sum.String(), "ratio scale_outbox-retention_rows=900_hot-x 0.93 target>=0.9 PASS")
}

// make bench-scale replaces the page's scale section and keeps the rest;
// make bench rewrites the rest and keeps the scale section.
func TestScaleSectionSurvivesEitherRun(t *testing.T) {
	path := filepath.Join(t.TempDir(), "RESULTS.md")
	bench, err := parse(strings.NewReader("nproc: 2\nBenchmarkRelay/oncekit-2 1 0 ns/op 60000 msgs/s\n"))
	if err != nil {
		t.Fatal(err)
	}
	scale := func(rate string) *run {
		r, err := parse(strings.NewReader("BenchmarkScale/consume/rows=0-2 1 " + rate + " msgs/s\n"))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// Each step reads the page as the previous one left it.
	for i, step := range []func() (*run, pageWriter){
		func() (*run, pageWriter) { return bench, keepScale(path) },
		func() (*run, pageWriter) { return scale("111"), replaceScale(path) },
		func() (*run, pageWriter) { return scale("222"), replaceScale(path) },
		func() (*run, pageWriter) { return bench, keepScale(path) },
	} {
		r, w := step()
		if err := writeResultsFile(path, r, "", w); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	page, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p := string(page)
	if strings.Count(p, "## Scale") != 1 || !strings.Contains(p, "| consume | msgs/s | 222 |  |") || strings.Contains(p, "111") {
		t.Errorf("scale section not replaced once:\n%s", p)
	}
	if strings.Count(p, "# Benchmark results") != 1 || !strings.Contains(p, "60,000") {
		t.Errorf("main page not kept:\n%s", p)
	}
}

// The console's pages: their time at the most rows, over the 1,000-row
// history (judged) and the empty tables, medians over the pairs.
func TestScaleConsolePages(t *testing.T) {
	r, err := parse(strings.NewReader(`BenchmarkScaleConsole/overview/rows=0-2 1 2 ns/op 1.2 ms 0.9 x-1k 1 x-empty
BenchmarkScaleConsole/audit/rows=0-2 1 2 ns/op 0.2 ms 0.4 x-1k 1 x-empty
BenchmarkScaleConsole/overview/rows=10000000-2 1 2 ns/op 3.0 ms 1.1 x-1k 2.0 x-empty
BenchmarkScaleConsole/audit/rows=10000000-2 1 2 ns/op 0.6 ms 0.9 x-1k 3.0 x-empty
BenchmarkScaleConsole/overview/rows=10000000#01-2 1 2 ns/op 3.4 ms 1.7 x-1k 2.2 x-empty
BenchmarkScaleConsole/audit/rows=10000000#01-2 1 2 ns/op 0.5 ms 0.8 x-1k 2.6 x-empty
BenchmarkScaleConsole/overview/rows=10000000#02-2 1 2 ns/op 3.2 ms 1.6 x-1k 2.1 x-empty
BenchmarkScaleConsole/audit/rows=10000000#02-2 1 2 ns/op 0.7 ms 1.0 x-1k 2.8 x-empty
`))
	if err != nil {
		t.Fatal(err)
	}
	var page bytes.Buffer
	if err := writeScale(&page, r, ""); err != nil {
		t.Fatal(err)
	}
	containsAll(t, "section", page.String(), "### Console pages",
		"| overview | 3.2 (3–3.4) | 1.6 (1.1–1.7) | 2.1 (2–2.2) | MISS |",
		"| audit | 0.6 (0.5–0.7) | 0.9 (0.8–1) | 2.8 (2.6–3) | PASS |")
	var sum bytes.Buffer
	writeSummary(&sum, r)
	containsAll(t, "summary", sum.String(), "ratio scale_console_overview_rows=10000000_x-1k 1.6 target<=1.5 MISS",
		"ratio scale_console_audit_rows=10000000_x-1k 0.9 target<=1.5 PASS")
}
