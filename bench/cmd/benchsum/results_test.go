package main

import (
	"bytes"
	"flag"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/RESULTS.md from testdata/bench.txt")

// The results page of a captured `make bench` output, against the page
// checked in beside it (go test -update rewrites it after a deliberate
// change).
func TestResultsPageOfCapturedRun(t *testing.T) {
	r := parseFile(t, "testdata/bench.txt")
	var got bytes.Buffer
	if err := writeResults(&got, r, "a test note."); err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile("testdata/RESULTS.md", got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("testdata/RESULTS.md")
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != string(want) {
		t.Fatalf("results page differs from testdata/RESULTS.md (go test -update rewrites it):\n%s", got.String())
	}
	page := got.String()
	for _, want := range []string{
		"- Date (the run's start): " + r.config["date"],
		"- Machine: 2 cores (`nproc`), CPU AMD EPYC, linux/amd64, go1.26.8",
		"- Runs: 2 iterations of each benchmark (`BENCH_COUNT=2`)",
		"other work shared the machine",
		"- Note: a test note.",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
}

func TestTargetVerdicts(t *testing.T) {
	r, err := parse(strings.NewReader(`nproc: 2
loadavg-start: 0.10 0.20 0.30
BenchmarkRelay/oncekit-2 1 0 ns/op 60000 msgs/s
BenchmarkRelay/watermill-2 1 0 ns/op 3000 msgs/s
BenchmarkEdge/new-key-2 1 0 ns/op 3 pg-rt/req
BenchmarkEdge/bare-2 1 0 ns/op 3 pg-rt/req
BenchmarkConsume/oncekit-batch-2 1 0 ns/op 0.25 claim-overhead
`))
	if err != nil {
		t.Fatal(err)
	}
	var sum bytes.Buffer
	writeSummary(&sum, r)
	containsAll(t, "summary", sum.String(),
		"ratio relay_oncekit/watermill 20 target>=15 PASS",
		"ratio edge_new-key_extra_round_trips 0 target<=1 PASS",
		"ratio consume_dedup-overhead 0.25 target<=0.2 MISS",
	)
	var page bytes.Buffer
	if err := writeResults(&page, r, ""); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(page.String(), "shared the machine") {
		t.Error("a quiet machine is described as shared")
	}
	if !strings.Contains(page.String(), "| relay drain vs watermill, msgs/s | 60,000 | 3,000 |  | 20 | >= 15 | PASS |") {
		t.Errorf("relay row missing:\n%s", page.String())
	}
}

func TestHuman(t *testing.T) {
	for v, want := range map[float64]string{102345.6: "102,346", 1000: "1,000", 999.4: "999", 999.9: "1,000", 0.1206: "0.121", -2500: "-2,500", 3: "3"} {
		if got := human(v); got != want {
			t.Errorf("human(%v) = %q, want %q", v, got, want)
		}
	}
}

// parseFile parses the captured run in file.
func parseFile(t *testing.T, file string) *run {
	t.Helper()
	in, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	r, err := parse(in)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// containsAll reports each of wants that got (the what) lacks.
func containsAll(t *testing.T, what, got string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(got, want) {
			t.Errorf("%s lacks %q:\n%s", what, want, got)
		}
	}
}

// BenchmarkLatencyE2E's lines make the end-to-end table: a row per
// condition and rate, quiet first, each contender's medians with their
// ranges and the relays' ratios to bare.
func TestLatencyTable(t *testing.T) {
	in := `BenchmarkLatencyE2E/contended-100-2 1 1 ns/op 100 bare-events/s 99.8 poll-events/s 100.1 logical-events/s 4 bare-p50-ms 12 bare-p99-ms 6 poll-p50-ms 60 poll-p99-ms 5 logical-p50-ms 20 logical-p99-ms 1.5 poll-x-bare-p50 5 poll-x-bare-p99 1.25 logical-x-bare-p50 1.67 logical-x-bare-p99
BenchmarkLatencyE2E/quiet-1000-2 1 1 ns/op 1 bare-p50-ms 5 bare-p99-ms 25 poll-p50-ms 80 poll-p99-ms 8 logical-p50-ms 54 logical-p99-ms 25 poll-x-bare-p50 16 poll-x-bare-p99 8 logical-x-bare-p50 10.8 logical-x-bare-p99
BenchmarkLatencyE2E/quiet-1000-2 1 1 ns/op 2 bare-p50-ms 6 bare-p99-ms 27 poll-p50-ms 90 poll-p99-ms 9 logical-p50-ms 50 logical-p99-ms 13.5 poll-x-bare-p50 15 poll-x-bare-p99 4.5 logical-x-bare-p50 8.3 logical-x-bare-p99
`
	r, err := parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	var page bytes.Buffer
	if err := writeResults(&page, r, ""); err != nil {
		t.Fatal(err)
	}
	s := page.String()
	quiet := strings.Index(s, "| quiet | 1,000 | 1.5 (1–2) | 5.5 (5–6) | 26 (25–27) | 85 (80–90) | 8.5 (8–9) | 52 (50–54) | 19.2, 15.5 | 6.25, 9.55 |  |")
	contended := strings.Index(s, "| contended | 100 | 4 | 12 | 6 | 60 | 5 | 20 | 1.5, 5 | 1.25, 1.67 | 100, 99.8, 100 |")
	if quiet < 0 || contended < 0 || quiet > contended {
		t.Fatalf("the latency table is not as expected:\n%s", s)
	}
}

// A ratio to bare is no pass when a contender's writers fell short of the
// rate asked: the two latencies were measured under unequal loads.
func TestE2ETargetNeedsTheLoad(t *testing.T) {
	const line = "BenchmarkLatencyE2E/quiet-5000-2 1 1 ns/op %v bare-events/s 4990 logical-events/s 4990 poll-events/s 0.5 logical-x-bare-p50 0.5 poll-x-bare-p50\n"
	for reached, want := range map[string]string{"4980": "PASS", "2539": "MISS"} {
		r, err := parse(strings.NewReader(strings.ReplaceAll(line, "%v", reached)))
		if err != nil {
			t.Fatal(err)
		}
		var sum, page bytes.Buffer
		writeSummary(&sum, r)
		if !strings.Contains(sum.String(), "ratio e2e_logical/bare_p50_quiet_5000/s 0.5 target<=2 "+want+"\n") {
			t.Errorf("bare reached %s/s: want %s, got:\n%s", reached, want, sum.String())
		}
		if err := writeResults(&page, r, ""); err != nil {
			t.Fatal(err)
		}
		if short := strings.Contains(page.String(), "0.5; load not reached (2,539/s)"); short != (want == "MISS") {
			t.Errorf("bare reached %s/s: the page says load not reached: %v\n%s", reached, short, page.String())
		}
	}
}

// The canonical-JSON target is the worst input's median ratio, not the
// worst of every iteration's.
func TestWorstInputFigure(t *testing.T) {
	in := `BenchmarkCanonicalJSON/deep-arrays-2 1 1 ns/op 3.9 x-encoding-json
BenchmarkCanonicalJSON/deep-arrays-2 1 1 ns/op 3.8 x-encoding-json
BenchmarkCanonicalJSON/deep-arrays-2 1 1 ns/op 3.7 x-encoding-json
BenchmarkCanonicalJSON/wide-object-2 1 1 ns/op 5.0 x-encoding-json
BenchmarkCanonicalJSON/wide-object-2 1 1 ns/op 2.9 x-encoding-json
BenchmarkCanonicalJSON/wide-object-2 1 1 ns/op 2.8 x-encoding-json
`
	r, err := parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	var sum bytes.Buffer
	writeSummary(&sum, r)
	if want := "ratio canonical-json_worst/encoding-json 3.8 target<=3 MISS\n"; !strings.Contains(sum.String(), want) {
		t.Errorf("want %q in:\n%s", want, sum.String())
	}
}

// The producer-side CPU target compares what each relay adds to bare's
// PostgreSQL CPU an event: the logical relay's part over the polling
// relay's, from the medians, at most one half.
func TestProducerCPUShare(t *testing.T) {
	const line = "BenchmarkLatencyE2E/quiet-1000-2 1 1 ns/op 1000 bare-events/s 1000 poll-events/s 1000 logical-events/s 140 bare-pg-producer-µs/event 662 poll-pg-producer-µs/event %v logical-pg-producer-µs/event\n"
	for logical, want := range map[string]string{
		"304": "0.3142 target<=0.5 PASS", // (304 − 140) / (662 − 140)
		"450": "0.5939 target<=0.5 MISS", // (450 − 140) / (662 − 140)
	} {
		r, err := parse(strings.NewReader(strings.ReplaceAll(line, "%v", logical)))
		if err != nil {
			t.Fatal(err)
		}
		var sum bytes.Buffer
		writeSummary(&sum, r)
		if got := sum.String(); !strings.Contains(got, "ratio e2e-pg-cpu_logical/poll_quiet_1000/s "+want+"\n") {
			t.Errorf("logical at %s µs an event: want %q in:\n%s", logical, want, got)
		}
	}
}
