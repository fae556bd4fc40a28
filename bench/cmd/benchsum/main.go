// Command benchsum reads `go test -bench` output (as `make bench` writes it
// to bench.txt) and prints, one machine-readable line each, the median of
// every reported metric and the ratios the targets are stated in, with
// PASS/MISS against each target:
//
//	median BenchmarkRelay/oncekit msgs/s 53800 n=3
//	ratio relay oncekit/watermill 11.0 target>=15 MISS
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// target is one ratio the issues set.
type target struct {
	name     string
	num, den string // "Benchmark/sub metric"
	// value computes the figure from the two medians.
	value func(num, den float64) float64
	op    string // ">=" or "<="
	limit float64
}

func ratio(n, d float64) float64 { return n / d }

var targets = []target{
	{"relay oncekit/watermill", "BenchmarkRelay/oncekit msgs/s", "BenchmarkRelay/watermill msgs/s", ratio, ">=", 15},
	// Ratios measured within each iteration (the peer or the raw limit run
	// just before oncekit), whose median is steadier than the ratio of two
	// medians taken minutes apart: the relay and dispatcher against the raw
	// limits, the batch consumer against watermill and against itself
	// without the claim.
	{"relay oncekit/jetstream", "BenchmarkRelay/oncekit x-jetstream", "", nil, ">=", 0.6},
	{"relay-latency p50-ms", "BenchmarkRelayLatency/poll p50-ms", "", nil, "<=", 5},
	{"relay-latency p99-ms", "BenchmarkRelayLatency/poll p99-ms", "", nil, "<=", 25},
	{"consume oncekit-batch/watermill", "BenchmarkConsume/oncekit-batch x-watermill", "", nil, ">=", 10},
	{"consume dedup-overhead", "BenchmarkConsume/oncekit-batch claim-overhead", "", nil, "<=", 0.20},
	// The same two targets for the batch consumer whose handler queues its
	// insert (inbox.Queue) instead of a round trip each.
	{"consume oncekit-batch-queue/watermill", "BenchmarkConsume/oncekit-batch-queue x-watermill", "", nil, ">=", 10},
	{"consume queue dedup-overhead", "BenchmarkConsume/oncekit-batch-queue claim-overhead", "", nil, "<=", 0.20},
	{"dispatch oncekit effects/s", "BenchmarkDispatch/oncekit effects/s", "", nil, ">=", 5000},
	{"dispatch oncekit/bare-http", "BenchmarkDispatch/oncekit x-bare", "", nil, ">=", 0.5},
	{"edge replay p50-ms", "BenchmarkEdge/replay p50-ms", "", nil, "<=", 1},
	{"edge new-key extra round trips", "BenchmarkEdge/new-key pg-rt/req", "BenchmarkEdge/bare pg-rt/req",
		func(n, d float64) float64 { return n - d }, "<=", 1},
}

// procSuffix is the -GOMAXPROCS suffix go test appends to benchmark names.
var procSuffix = regexp.MustCompile(`-\d+$`)

func main() {
	samples, err := parse(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchsum:", err)
		os.Exit(1)
	}
	keys := make([]string, 0, len(samples))
	for k := range samples {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	med := map[string]float64{}
	for _, k := range keys {
		med[k] = median(samples[k])
		fmt.Printf("median %s %s n=%d\n", k, num(med[k]), len(samples[k]))
	}
	for _, t := range targets {
		n, ok := med[t.num]
		if !ok {
			continue
		}
		v := n
		if t.den != "" {
			d, ok := med[t.den]
			if !ok || d == 0 {
				continue
			}
			v = t.value(n, d)
		}
		pass := v >= t.limit
		if t.op == "<=" {
			pass = v <= t.limit
		}
		verdict := "MISS"
		if pass {
			verdict = "PASS"
		}
		fmt.Printf("ratio %s %s target%s%s %s\n", strings.ReplaceAll(t.name, " ", "_"), num(v), t.op, num(t.limit), verdict)
	}
}

// parse collects every "value unit" pair of every benchmark line, keyed
// "BenchmarkName/sub unit".
func parse(r io.Reader) (map[string][]float64, error) {
	out := map[string][]float64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := procSuffix.ReplaceAllString(f[0], "")
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			if f[i+1] == "ns/op" {
				continue
			}
			key := name + " " + f[i+1]
			out[key] = append(out[key], v)
		}
	}
	return out, sc.Err()
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func num(v float64) string { return strconv.FormatFloat(v, 'g', 4, 64) }
