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
	for v, want := range map[float64]string{102345.6: "102,346", 1000: "1,000", 999.4: "999", 0.1206: "0.121", -2500: "-2,500", 3: "3"} {
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
