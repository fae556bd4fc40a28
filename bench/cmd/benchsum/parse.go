package main

import (
	"bufio"
	"io"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// run is one `go test -bench` output: every sample of every metric, and the
// configuration lines ("key: value") that came with it.
type run struct {
	samples map[string][]float64 // "BenchmarkName/sub unit" → values in order
	order   []string             // the samples' keys in order of first appearance
	config  map[string]string    // the last value of each key
}

// procSuffix is the -GOMAXPROCS suffix go test appends to benchmark names.
var procSuffix = regexp.MustCompile(`-\d+$`)

// repeatSuffix is what go test appends to a sub-benchmark run again under
// the same name (#01, #02…): the repeats are samples of one figure.
var repeatSuffix = regexp.MustCompile(`#\d+$`)

// configLine is a line of the benchmark format's configuration:
// "goos: linux", "cpu: AMD EPYC", "nproc: 2".
var configLine = regexp.MustCompile(`^([a-z][a-zA-Z0-9_-]*):\s*(.*)$`)

// parse collects every "value unit" pair of every benchmark line, keyed
// "BenchmarkName/sub unit", and the configuration lines.
func parse(r io.Reader) (*run, error) {
	out := &run{samples: map[string][]float64{}, config: map[string]string{}}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if m := configLine.FindStringSubmatch(sc.Text()); m != nil {
			out.config[m[1]] = strings.TrimSpace(m[2])
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := repeatSuffix.ReplaceAllString(procSuffix.ReplaceAllString(f[0], ""), "")
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			if f[i+1] == "ns/op" {
				continue
			}
			key := name + " " + f[i+1]
			if _, ok := out.samples[key]; !ok {
				out.order = append(out.order, key)
			}
			out.samples[key] = append(out.samples[key], v)
		}
	}
	return out, sc.Err()
}

// keys returns the metrics in name order.
func (r *run) keys() []string {
	return slices.Sorted(maps.Keys(r.samples))
}

// median is the median of metric k's samples; 0 when there is none.
func (r *run) median(k string) float64 {
	if len(r.samples[k]) == 0 {
		return 0
	}
	return median(r.samples[k])
}

// spread returns the smallest and largest sample of metric k.
func (r *run) spread(k string) (lo, hi float64) {
	s := r.samples[k]
	lo, hi = s[0], s[0]
	for _, v := range s[1:] {
		lo, hi = min(lo, v), max(hi, v)
	}
	return lo, hi
}

// runs is the largest number of samples any metric has: the -count the
// benchmarks ran with.
func (r *run) runs() int {
	n := 0
	for _, s := range r.samples {
		n = max(n, len(s))
	}
	return n
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
