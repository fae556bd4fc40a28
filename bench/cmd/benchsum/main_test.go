package main

import (
	"strings"
	"testing"
)

func TestParseAndMedian(t *testing.T) {
	in := `goos: linux
BenchmarkRelay/oncekit-2         	       1	1000 ns/op	     50000 msgs/s
BenchmarkRelay/oncekit-2         	       1	1000 ns/op	     70000 msgs/s
BenchmarkRelay/oncekit-2         	       1	1000 ns/op	     60000 msgs/s
BenchmarkEdge/replay-2   1   0 ns/op   0.40 p50-ms   3.0 p99-ms   7000 req/s
PASS`
	s, err := parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if got := median(s.samples["BenchmarkRelay/oncekit msgs/s"]); got != 60000 {
		t.Fatalf("median = %v, want 60000", got)
	}
	if got := s.samples["BenchmarkEdge/replay p50-ms"]; len(got) != 1 || got[0] != 0.40 {
		t.Fatalf("p50 = %v", got)
	}
	if _, ok := s.samples["BenchmarkRelay/oncekit ns/op"]; ok {
		t.Fatal("ns/op must be skipped")
	}
	if got := median([]float64{1, 3, 2, 4}); got != 2.5 {
		t.Fatalf("even median = %v", got)
	}
}
