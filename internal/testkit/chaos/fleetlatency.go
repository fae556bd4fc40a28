package chaos

import (
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"time"
)

// latencySecond is the commit-to-publish latency of the events of the
// databases other than the stopped one, committed in one second of a
// fleet run.
type latencySecond struct {
	At            time.Time
	Window        string // "before", "down", "after" or "" (no window)
	Events        int
	P50, P99, Max time.Duration
	WorstDB       string // the database of the slowest event
}

// latencySeconds splits what CheckFleet compares into seconds, so that a
// run's isolation verdict can be read against the moments that made it: a
// stall of the whole machine slows every database at once, one of the
// fleet's own slows those its members serve.
func latencySeconds(o *FleetObservations) []latencySecond {
	first := make(map[string]time.Time, len(o.Stream))
	for _, e := range o.Stream {
		if _, ok := first[e.EventID]; !ok {
			first[e.EventID] = e.At
		}
	}
	type bucket struct {
		lats  []time.Duration
		worst string
		max   time.Duration
	}
	buckets := map[int64]*bucket{}
	for _, w := range o.Written {
		at, ok := first[w.ID]
		if !ok || w.DB == o.DownDB {
			continue
		}
		s := w.At.Truncate(time.Second).Unix()
		b := buckets[s]
		if b == nil {
			b = &bucket{}
			buckets[s] = b
		}
		lat := at.Sub(w.At)
		b.lats = append(b.lats, lat)
		if lat > b.max {
			b.max, b.worst = lat, w.DB
		}
	}
	var out []latencySecond
	for _, s := range slices.Sorted(maps.Keys(buckets)) {
		b := buckets[s]
		slices.Sort(b.lats)
		at := time.Unix(s, 0)
		out = append(out, latencySecond{At: at, Window: o.windowOf(at), Events: len(b.lats),
			P50: rank(b.lats, 0.5), P99: rank(b.lats, 0.99), Max: b.max, WorstDB: b.worst})
	}
	return out
}

// windowOf names the latency window holding t.
func (o *FleetObservations) windowOf(t time.Time) string {
	switch {
	case o.Down.holds(t):
		return "down"
	case len(o.Baselines) > 0 && o.Baselines[0].holds(t):
		return "before"
	case len(o.Baselines) > 1 && o.Baselines[1].holds(t):
		return "after"
	}
	return ""
}

// writeLatencySeconds writes the seconds as a tab-separated table.
func writeLatencySeconds(w io.Writer, secs []latencySecond) error {
	if _, err := fmt.Fprintln(w, "second\twindow\tevents\tp50_ms\tp99_ms\tmax_ms\tworst_db"); err != nil {
		return err
	}
	for _, s := range secs {
		win := s.Window
		if win == "" {
			win = "-"
		}
		if _, err := fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%s\n", s.At.UTC().Format("15:04:05"), win, s.Events,
			s.P50.Milliseconds(), s.P99.Milliseconds(), s.Max.Milliseconds(), s.WorstDB); err != nil {
			return err
		}
	}
	return nil
}

// saveLatencySeconds writes o's latency by second to the file at path.
func saveLatencySeconds(path string, o *FleetObservations) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := writeLatencySeconds(f, latencySeconds(o)); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
