package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// scaleHeading starts the section `make bench-scale` adds to the results
// page; a later `make bench` keeps it, a later `make bench-scale` replaces it.
const scaleHeading = "## Scale"

// The scale targets: a hot path at the most retained rows keeps this share
// of its rate on empty tables (paired), and its p99 latency within this
// multiple; retention deletes this many rows/s while the hot path keeps this
// share of its rate; a daemon's peak RSS stays within this many MiB; a
// console page's server time at the most rows stays within this multiple of
// its time on a 1,000-row history (paired).
const (
	scaleMinRate       = 0.8
	scaleMaxP99        = 2
	scaleMinDeleted    = 50_000
	scaleMinHotRate    = 0.9
	scaleMaxRSSMiB     = 200
	scaleMaxConsole    = 1.5
	scalePrefix        = "BenchmarkScale/"
	scaleMemoryPrefix  = "BenchmarkScaleMemory/"
	scaleConsolePrefix = "BenchmarkScaleConsole/"
	scaleRetentionPart = "-retention"
)

// scaleFigure is one line's metrics: BenchmarkScale/<path>/rows=<rows>.
type scaleFigure struct {
	path string
	rows int
}

// scaleFigures lists the run's BenchmarkScale lines (retention and memory
// apart), by path in order of appearance, then rows.
func (r *run) scaleFigures() (hot, retention []scaleFigure) {
	for _, f := range r.figures(scalePrefix) {
		if strings.HasSuffix(f.path, scaleRetentionPart) {
			retention = append(retention, f)
		} else {
			hot = append(hot, f)
		}
	}
	return hot, retention
}

// figures lists the run's <prefix><path>/rows=<rows> lines, by path in
// order of appearance, then rows.
func (r *run) figures(prefix string) []scaleFigure {
	var out []scaleFigure
	seen := map[scaleFigure]bool{}
	for _, k := range r.order {
		name, _, _ := strings.Cut(k, " ")
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok {
			continue
		}
		path, rowsPart, ok := strings.Cut(rest, "/rows=")
		rows, err := strconv.Atoi(rowsPart)
		if !ok || err != nil {
			continue
		}
		f := scaleFigure{path, rows}
		if !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	return out
}

// consoleMetric is the median of a console page's metric unit at rows, and
// whether it was measured.
func (r *run) consoleMetric(f scaleFigure, unit string) (float64, bool) {
	k := fmt.Sprintf("%s%s/rows=%d %s", scaleConsolePrefix, f.path, f.rows, unit)
	if len(r.samples[k]) == 0 {
		return 0, false
	}
	return r.median(k), true
}

// metric is the median of the figure's metric unit, and whether it was
// measured.
func (r *run) metric(f scaleFigure, unit string) (float64, bool) {
	k := fmt.Sprintf("%s%s/rows=%d %s", scalePrefix, f.path, f.rows, unit)
	if len(r.samples[k]) == 0 {
		return 0, false
	}
	return r.median(k), true
}

// total is the sum of a metric's samples and how many there are.
type total struct {
	n int
	v float64
}

// text is the sum, or empty when the metric was not measured.
func (t total) text() string {
	if t.n == 0 {
		return ""
	}
	return human(t.v)
}

// sum is the total of the figure's metric unit over its samples.
func (r *run) sum(f scaleFigure, unit string) total {
	vs := r.samples[fmt.Sprintf("%s%s/rows=%d %s", scalePrefix, f.path, f.rows, unit)]
	var t total
	for _, v := range vs {
		t.n++
		t.v += v
	}
	return t
}

// scaleVerdicts returns one line per scale target: the figure, the target and
// PASS or MISS, in the summary's machine-readable form.
func scaleVerdicts(r *run) []string {
	var out []string
	hot, retention := r.scaleFigures()
	top := map[string]int{}
	for _, f := range hot {
		top[f.path] = max(top[f.path], f.rows)
	}
	for _, f := range hot {
		if f.rows != top[f.path] || f.rows == 0 {
			continue
		}
		if v, ok := r.metric(f, "x-empty"); ok {
			out = append(out, verdictLine("scale "+f.path+" rows="+strconv.Itoa(f.rows)+" x-empty", v, ">=", scaleMinRate))
		}
		if v, ok := r.metric(f, "p99-x-empty"); ok {
			out = append(out, verdictLine("scale "+f.path+" rows="+strconv.Itoa(f.rows)+" p99-x-empty", v, "<=", scaleMaxP99))
		}
	}
	for _, f := range retention {
		if v, ok := r.metric(f, "deleted-rows/s"); ok {
			out = append(out, verdictLine("scale "+f.path+" rows="+strconv.Itoa(f.rows)+" deleted-rows/s", v, ">=", scaleMinDeleted))
		}
		if v, ok := r.metric(f, "hot-x"); ok {
			out = append(out, verdictLine("scale "+f.path+" rows="+strconv.Itoa(f.rows)+" hot-x", v, ">=", scaleMinHotRate))
		}
	}
	for _, k := range r.keys() {
		if strings.HasPrefix(k, scaleMemoryPrefix) && strings.HasSuffix(k, " peak-rss-MiB") {
			name, _, _ := strings.Cut(strings.TrimPrefix(k, scaleMemoryPrefix), " ")
			out = append(out, verdictLine("scale memory "+name+" peak-rss-MiB", r.median(k), "<=", scaleMaxRSSMiB))
		}
	}
	pages, most := r.consolePages()
	for _, p := range pages {
		if v, ok := r.consoleMetric(scaleFigure{p, most}, "x-1k"); ok && most > 0 {
			out = append(out, verdictLine("scale console "+p+" rows="+strconv.Itoa(most)+" x-1k", v, "<=", scaleMaxConsole))
		}
	}
	return out
}

// consolePages lists the console pages the run timed, in order of
// appearance, and the most rows they were timed at.
func (r *run) consolePages() (pages []string, most int) {
	for _, f := range r.figures(scaleConsolePrefix) {
		if !slices.Contains(pages, f.path) {
			pages = append(pages, f.path)
		}
		most = max(most, f.rows)
	}
	return pages, most
}

func verdictLine(name string, v float64, op string, limit float64) string {
	t := target{op: op, limit: limit}
	return fmt.Sprintf("%s %s target%s%s %s", strings.ReplaceAll(name, " ", "_"), num(v), op, num(limit), t.verdict(v))
}

// writeScale writes the scale section: where and when the run was made, the
// rate of each hot path against the rows retained, retention under load, and
// the daemons' peak memory, each with its verdict.
func writeScale(w io.Writer, r *run, note string) error {
	var b strings.Builder
	b.WriteString(scaleHeading + "\n\n")
	b.WriteString("Added by `make bench-scale` (`BenchmarkScale`, `BenchmarkScaleMemory`, `BenchmarkScaleConsole`); a later `make bench` keeps\n")
	b.WriteString("this section, a later `make bench-scale` replaces it. What it measures is in\n")
	b.WriteString("[docs/benchmarks.md](../docs/benchmarks.md#scale).\n\n")
	hot, retention := r.scaleFigures()
	n := 0 // the pairs of a hot path at a row count, not the retention's passes
	for _, k := range r.keys() {
		if name, _, _ := strings.Cut(k, " "); strings.HasPrefix(name, scalePrefix) && !strings.Contains(name, scaleRetentionPart+"/") {
			n = max(n, len(r.samples[k]))
		}
	}
	writeRunLines(&b, r, fmt.Sprintf("%d paired measurement%s of each hot path at each row count (`SCALE_PAIRS` on each fill,\n"+
		"  times `SCALE_COUNT`); each figure is the median. Retention: passes as its table says; memory: one run per `SCALE_COUNT`.", n, plural(n)), note)

	var rows []int
	var paths []string
	for _, f := range hot {
		if !slices.Contains(rows, f.rows) {
			rows = append(rows, f.rows)
		}
		if !slices.Contains(paths, f.path) {
			paths = append(paths, f.path)
		}
	}
	slices.Sort(rows)
	if len(paths) > 0 {
		b.WriteString("\n### Rate against retained rows\n\n")
		fmt.Fprintf(&b, "Each filled figure is paired with a run on empty tables made just before it: (×) is the filled\n")
		fmt.Fprintf(&b, "rate over that empty rate, or for latencies the filled p99 over the empty p99. Target at the most\n")
		fmt.Fprintf(&b, "rows: rate ≥ %s× empty, p99 ≤ %s× empty.\n\n", num(scaleMinRate), num(scaleMaxP99))
		b.WriteString("| hot path | figure |")
		for _, n := range rows {
			fmt.Fprintf(&b, " %s rows |", human(float64(n)))
		}
		b.WriteString(" |\n|---|---|" + strings.Repeat("---|", len(rows)) + "---|\n")
		for _, p := range paths {
			for _, unit := range r.scaleUnits(p) {
				fmt.Fprintf(&b, "| %s | %s |", p, unit)
				verdict := ""
				for _, n := range rows {
					f := scaleFigure{p, n}
					v, ok := r.metric(f, unit)
					if !ok {
						b.WriteString(" |")
						continue
					}
					cell := human(v)
					ratioUnit, op, limit := "x-empty", ">=", scaleMinRate
					if strings.HasSuffix(unit, "-ms") {
						ratioUnit, op, limit = "p99-x-empty", "<=", scaleMaxP99
					}
					if x, ok := r.metric(f, ratioUnit); ok && (unit == "p99-ms" || !strings.HasSuffix(unit, "-ms")) {
						cell += " (" + human(x) + "×)"
						verdict = target{op: op, limit: limit}.verdict(x)
					}
					b.WriteString(" " + cell + " |")
				}
				b.WriteString(" " + verdict + " |\n")
			}
		}
	}

	if len(retention) > 0 {
		b.WriteString("\n### Retention under load\n\n")
		b.WriteString("Each table's retention deletes its filled backlog while the table's first hot path runs paced at 80%\n")
		b.WriteString("of its empty-table rate, in passes, each deleting the rows older than an age (the oldest first), so\n")
		b.WriteString("that each pass is a pair with the same paced run just before it without retention; the edge's records\n")
		b.WriteString("expire at a time set when written, so its passes are parted by time, each but the last taking the\n")
		b.WriteString("time its share of the rows takes at the retention rate. Figures are medians over the passes;\n")
		b.WriteString("hot-path figures are during the deletion, (×) over the paced run before. The rate kept is the hot\n")
		b.WriteString("path's work over the wall time; its speed at work is the rate of its measurements alone, which slows\n")
		b.WriteString("before the rate kept does. The paced run before shows the share of the pace it kept: below 1× the\n")
		b.WriteString("table's state (autovacuum after the passes before, say) slowed the path before the deletion began.\n")
		b.WriteString("Checkpoints are those the server began during the passes, together.\n")
		fmt.Fprintf(&b, "Target: ≥ %s rows/s deleted while the hot path keeps ≥ %s× its rate.\n\n",
			human(scaleMinDeleted), num(scaleMinHotRate))
		b.WriteString("| table | rows | passes | deleted a pass | deleted rows/s | hot-path rate kept | speed at work | hot-path p99 ms | paced run before | checkpoints | |\n" +
			"|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, f := range retention {
			passes, checkpoints := r.sum(f, "deleted-rows/s"), r.sum(f, "checkpoints")
			deleted, _ := r.metric(f, "deleted")
			perSec, _ := r.metric(f, "deleted-rows/s")
			rate, _ := r.metric(f, "hot-rate")
			x, _ := r.metric(f, "hot-x")
			busy := ""
			if v, ok := r.metric(f, "hot-busy-x"); ok {
				busy = human(v) + "×"
			}
			p99 := ""
			if v, ok := r.metric(f, "hot-p99-ms"); ok {
				px, _ := r.metric(f, "hot-p99-x")
				p99 = human(v) + " (" + human(px) + "×)"
			}
			before := ""
			if v, ok := r.metric(f, "hot-quiet-x"); ok {
				before = human(v) + "× of the pace"
			}
			pass := perSec >= scaleMinDeleted && x >= scaleMinHotRate
			fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %s (%s×) | %s | %s | %s | %s | %s |\n", strings.TrimSuffix(f.path, scaleRetentionPart),
				human(float64(f.rows)), passes.n, human(deleted), human(perSec), human(rate), human(x), busy, p99, before, checkpoints.text(),
				map[bool]string{true: "PASS", false: "MISS"}[pass])
		}
	}

	if pages, most := r.consolePages(); len(pages) > 0 && most > 0 {
		b.WriteString("\n### Console pages\n\n")
		b.WriteString("Each page's server time (the handler's, without the network; the median of its requests) with\n")
		fmt.Fprintf(&b, "%s rows in each table, and (×) over the same page in the same pair on a history of 1,000 rows of\n", human(float64(most)))
		b.WriteString("each table (the least in which every page shows what it shows at any size) and on empty tables,\n")
		b.WriteString("where a page that lists rows lists none. Medians over the pairs, with their ranges.\n")
		fmt.Fprintf(&b, "Target: ≤ %s× the 1,000-row history.\n\n", num(scaleMaxConsole))
		b.WriteString("| page | ms | × 1,000 rows | × empty | |\n|---|---|---|---|---|\n")
		cell := func(f scaleFigure, unit string) string {
			k := fmt.Sprintf("%s%s/rows=%d %s", scaleConsolePrefix, f.path, f.rows, unit)
			if len(r.samples[k]) == 0 {
				return ""
			}
			lo, hi := r.spread(k)
			return fmt.Sprintf("%s (%s–%s)", human(r.median(k)), human(lo), human(hi))
		}
		for _, p := range pages {
			f := scaleFigure{p, most}
			verdict := ""
			if x, ok := r.consoleMetric(f, "x-1k"); ok {
				verdict = target{op: "<=", limit: scaleMaxConsole}.verdict(x)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", p, cell(f, "ms"), cell(f, "x-1k"), cell(f, "x-empty"), verdict)
		}
	}

	var mem []string
	for _, k := range r.keys() {
		if strings.HasPrefix(k, scaleMemoryPrefix) && strings.HasSuffix(k, " peak-rss-MiB") {
			mem = append(mem, k)
		}
	}
	if len(mem) > 0 {
		b.WriteString("\n### Daemon memory\n\n")
		fmt.Fprintf(&b, "Peak RSS (`VmHWM`) of each daemon, run as its own process, while it drains its backlog. Target ≤ %s MiB.\n\n", num(scaleMaxRSSMiB))
		b.WriteString("| daemon | backlog | peak RSS MiB | drain rate | |\n|---|---|---|---|---|\n")
		for _, k := range mem {
			name, _, _ := strings.Cut(k, " ")
			daemon := strings.TrimPrefix(name, scaleMemoryPrefix)
			v := r.median(k)
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", daemon, human(r.median(name+" backlog")), human(v),
				human(r.median(name+" rows/s"))+" rows/s", target{op: "<=", limit: scaleMaxRSSMiB}.verdict(v))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// scaleUnits lists the metrics shown for path p: its rate, and its p50 and
// p99 where it measures latencies.
func (r *run) scaleUnits(p string) []string {
	var out []string
	for _, k := range r.order {
		name, unit, _ := strings.Cut(k, " ")
		if !strings.HasPrefix(name, scalePrefix+p+"/rows=") || slices.Contains(out, unit) {
			continue
		}
		if strings.HasSuffix(unit, "/s") || unit == "p50-ms" || unit == "p99-ms" {
			out = append(out, unit)
		}
	}
	slices.SortStableFunc(out, func(a, b string) int { return rank(a) - rank(b) })
	return out
}

// rank orders a path's rows: rate, p50, p99.
func rank(unit string) int {
	switch unit {
	case "p50-ms":
		return 1
	case "p99-ms":
		return 2
	}
	return 0
}

// withScaleSection returns page with its scale section (from scaleHeading to
// the end) replaced by section, or section appended when it has none.
func withScaleSection(page, section string) string {
	if i := strings.Index(page, "\n"+scaleHeading+"\n"); i >= 0 {
		page = page[:i+1]
	}
	if page != "" && !strings.HasSuffix(page, "\n\n") {
		page = strings.TrimRight(page, "\n") + "\n\n"
	}
	return page + section
}

// scaleSectionOf returns the scale section of the page at path ("" when the
// page or the section does not exist).
func scaleSectionOf(path string) string {
	page, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if i := strings.Index(string(page), "\n"+scaleHeading+"\n"); i >= 0 {
		return string(page[i+1:])
	}
	return ""
}
