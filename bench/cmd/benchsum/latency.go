package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// writeLatency writes the end-to-end latency table of BenchmarkLatencyE2E:
// a row per condition and rate, each contender's p50 and p99 (medians, with
// their ranges), and the relays' ratios to bare; nothing when the run has
// none.
func writeLatency(b *strings.Builder, r *run) {
	type row struct {
		cond string
		rate int
	}
	seen := map[row]bool{}
	var rows []row
	for _, k := range r.keys() {
		name, _, _ := strings.Cut(k, " ")
		sub, ok := strings.CutPrefix(name, "BenchmarkLatencyE2E/")
		if !ok {
			continue
		}
		cond, rate, ok := strings.Cut(sub, "-")
		n, err := strconv.Atoi(rate)
		if !ok || err != nil {
			continue
		}
		if rw := (row{cond, n}); !seen[rw] {
			seen[rw] = true
			rows = append(rows, rw)
		}
	}
	if len(rows) == 0 {
		return
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].cond != rows[j].cond {
			return rows[i].cond == "quiet"
		}
		return rows[i].rate < rows[j].rate
	})
	b.WriteString("\n## End to end: commit to the handler's commit\n\n")
	b.WriteString("`BenchmarkLatencyE2E`: events committed one per transaction at each rate, from the producer's\n")
	b.WriteString("commit to the consumer's handler having committed, in milliseconds (median over the iterations, with\n")
	b.WriteString("the range); the ratios are to bare's in the same iteration. Contended: one busy loop per core.\n")
	b.WriteString("Reached: the lowest rate each contender's writers reached in an iteration (bare, polling, logical);\n")
	b.WriteString("where one is short of the rate asked, its ratios compare unequal loads and are no pass.\n")
	b.WriteString("What each contender runs is in [docs/benchmarks.md](../docs/benchmarks.md#end-to-end).\n\n")
	b.WriteString("| condition | events/s | bare p50 | bare p99 | polling p50 | polling p99 | logical p50 | logical p99 | polling ×bare p50, p99 | logical ×bare p50, p99 | reached |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, rw := range rows {
		name := fmt.Sprintf("BenchmarkLatencyE2E/%s-%d ", rw.cond, rw.rate)
		cell := func(metric string) string {
			k := name + metric
			if len(r.samples[k]) == 0 {
				return ""
			}
			s := human(r.median(k))
			if len(r.samples[k]) > 1 {
				lo, hi := r.spread(k)
				s += " (" + human(lo) + "–" + human(hi) + ")"
			}
			return s
		}
		ratios := func(relay string) string {
			p50, p99 := name+relay+"-x-bare-p50", name+relay+"-x-bare-p99"
			if len(r.samples[p50]) == 0 {
				return ""
			}
			return human(r.median(p50)) + ", " + human(r.median(p99))
		}
		var reached []string
		for _, c := range []string{"bare", "poll", "logical"} {
			if k := name + c + "-events/s"; len(r.samples[k]) > 0 {
				lo, _ := r.spread(k)
				reached = append(reached, human(lo))
			}
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", rw.cond, human(float64(rw.rate)),
			cell("bare-p50-ms"), cell("bare-p99-ms"), cell("poll-p50-ms"), cell("poll-p99-ms"),
			cell("logical-p50-ms"), cell("logical-p99-ms"), ratios("poll"), ratios("logical"), strings.Join(reached, ", "))
	}
}
