package main

import (
	"fmt"
	"strings"
)

// target is one figure the project sets a target for.
type target struct {
	name string // machine-readable name, on the summary's "ratio" lines
	what string // the capability, on the results page
	// num is the figure's metric ("Benchmark/sub unit"); with den set, the
	// figure is value(median num, median den), else the median of num (a
	// ratio measured within each iteration, whose median is steadier than
	// the ratio of two medians taken minutes apart).
	num, den string
	// base, when set, is subtracted from num's and den's medians before
	// value: each contender's own part above a common baseline.
	base  string
	value func(num, den float64) float64
	op    string // ">=" or "<="
	limit float64
	// Beside the figure the results page shows rates or times in unit rate
	// (none when rate is empty): oncekit's, of num's sub-benchmark, and
	// those of the sub-benchmarks peer (watermill) and raw (the raw limit)
	// of num's benchmark.
	rate, peer, raw string
	// reached lists the metrics of the load each contender reached, and
	// asked the load they were asked for: a contender below 95% of it in
	// any iteration makes the figure a comparison of unequal loads, which
	// is no pass.
	reached []string
	asked   float64
}

func ratio(n, d float64) float64 { return n / d }

var targets = []target{
	{name: "relay oncekit/watermill", what: "relay drain vs watermill, msgs/s",
		num: "BenchmarkRelay/oncekit msgs/s", den: "BenchmarkRelay/watermill msgs/s", value: ratio, op: ">=", limit: 15,
		rate: "msgs/s", peer: "watermill"},
	{name: "relay oncekit/jetstream", what: "relay drain vs bare JetStream (paired)",
		num: "BenchmarkRelay/oncekit x-jetstream", op: ">=", limit: 0.6, rate: "msgs/s", raw: "jetstream"},
	{name: "relay oncekit-logical/jetstream", what: "logical relay drain vs bare JetStream (paired)",
		num: "BenchmarkRelay/oncekit-logical x-jetstream", op: ">=", limit: 0.95, rate: "msgs/s", raw: "jetstream"},
	{name: "relay-latency p50-ms", what: "relay latency p50 ms (1,000 events/s, polling)",
		num: "BenchmarkRelayLatency/poll p50-ms", op: "<=", limit: 5},
	{name: "relay-latency p99-ms", what: "relay latency p99 ms (polling)",
		num: "BenchmarkRelayLatency/poll p99-ms", op: "<=", limit: 25},
	{name: "consume oncekit-batch/watermill", what: "batch consumer vs watermill (paired)",
		num: "BenchmarkConsume/oncekit-batch x-watermill", op: ">=", limit: 10, rate: "msgs/s", peer: "watermill"},
	{name: "consume dedup-overhead", what: "dedup overhead, batch vs no claim (paired)",
		num: "BenchmarkConsume/oncekit-batch claim-overhead", op: "<=", limit: 0.20, rate: "msgs/s", raw: "oncekit-noclaim"},
	// The same two for the batch consumer whose handler queues its insert
	// (inbox.Queue) instead of making a round trip.
	{name: "consume oncekit-batch-queue/watermill", what: "batch consumer, queued writes, vs watermill (paired)",
		num: "BenchmarkConsume/oncekit-batch-queue x-watermill", op: ">=", limit: 10, rate: "msgs/s", peer: "watermill"},
	{name: "consume queue dedup-overhead", what: "dedup overhead, queued writes (paired)",
		num: "BenchmarkConsume/oncekit-batch-queue claim-overhead", op: "<=", limit: 0.20, rate: "msgs/s", raw: "oncekit-noclaim-queue"},
	{name: "dispatch oncekit effects/s", what: "dispatcher, effects/s",
		num: "BenchmarkDispatch/oncekit effects/s", op: ">=", limit: 5000, rate: "effects/s"},
	{name: "dispatch oncekit/bare-http", what: "dispatcher vs bare HTTP (paired)",
		num: "BenchmarkDispatch/oncekit x-bare", op: ">=", limit: 0.5, rate: "effects/s", raw: "bare-http"},
	{name: "edge replay p50-ms", what: "edge replay p50 ms",
		num: "BenchmarkEdge/replay p50-ms", op: "<=", limit: 1, rate: "p50-ms", raw: "bare"},
	{name: "edge new-key extra round trips", what: "edge first request, extra PostgreSQL round trips",
		num: "BenchmarkEdge/new-key pg-rt/req", den: "BenchmarkEdge/bare pg-rt/req",
		value: func(n, d float64) float64 { return n - d }, op: "<=", limit: 1, rate: "pg-rt/req", raw: "bare"},
	// End to end, commit to the handler's commit, as ratios to a bare
	// commit, publish and consuming commit in the same iteration: p50 and
	// p99 within 2x quiet, p99 within 3x with both cores contended.
	e2e("poll", "quiet", 100, "p50", 2), e2e("poll", "quiet", 100, "p99", 2), e2e("poll", "contended", 100, "p99", 3),
	e2e("poll", "quiet", 1000, "p50", 2), e2e("poll", "quiet", 1000, "p99", 2), e2e("poll", "contended", 1000, "p99", 3),
	e2e("poll", "quiet", 5000, "p50", 2), e2e("poll", "quiet", 5000, "p99", 2), e2e("poll", "contended", 5000, "p99", 3),
	e2e("logical", "quiet", 100, "p50", 2), e2e("logical", "quiet", 100, "p99", 2), e2e("logical", "contended", 100, "p99", 3),
	e2e("logical", "quiet", 1000, "p50", 2), e2e("logical", "quiet", 1000, "p99", 2), e2e("logical", "contended", 1000, "p99", 3),
	e2e("logical", "quiet", 5000, "p50", 2), e2e("logical", "quiet", 5000, "p99", 2), e2e("logical", "contended", 5000, "p99", 3),
	// The producer side's PostgreSQL CPU an event that oncekit adds to
	// bare's, the logical relay's at most half the polling relay's.
	producerCPU("quiet", 100), producerCPU("quiet", 1000), producerCPU("quiet", 5000),
	producerCPU("contended", 100), producerCPU("contended", 1000), producerCPU("contended", 5000),
	{name: "canonical-json worst/encoding-json", what: "edge fingerprint, adversarial 1 MiB bodies, worst input's time vs encoding/json (paired)",
		num: "BenchmarkCanonicalJSON/* x-encoding-json", op: "<=", limit: 3},
}

// e2e is the target for BenchmarkLatencyE2E's relay (poll or logical) at
// rate events/s, in condition (quiet or contended), at percentile p (p50,
// p99).
func e2e(relay, condition string, rate int, p string, limit float64) target {
	bench := fmt.Sprintf("BenchmarkLatencyE2E/%s-%d ", condition, rate)
	return target{
		name: fmt.Sprintf("e2e %s/bare %s %s %d/s", relay, p, condition, rate),
		what: fmt.Sprintf("end to end, commit to handler commit, %s relay, %s, %s, %s events/s, vs bare (paired)", relay, p, condition, human(float64(rate))),
		num:  bench + relay + "-x-bare-" + p, op: "<=", limit: limit,
		reached: []string{bench + "bare-events/s", bench + relay + "-events/s"}, asked: float64(rate),
	}
}

// producerCPU is the target for BenchmarkLatencyE2E's producer-side
// PostgreSQL CPU an event (the producers' backends, the relay's and the
// WAL sender's) at rate events/s in condition: what the logical relay adds
// to bare's over what the polling relay adds, at most one half.
func producerCPU(condition string, rate int) target {
	bench := fmt.Sprintf("BenchmarkLatencyE2E/%s-%d ", condition, rate)
	return target{
		name: fmt.Sprintf("e2e-pg-cpu logical/poll %s %d/s", condition, rate),
		what: fmt.Sprintf("producer-side PostgreSQL CPU an event above bare's, logical relay vs polling relay, %s, %s events/s", condition, human(float64(rate))),
		num:  bench + "logical-pg-producer-µs/event", den: bench + "poll-pg-producer-µs/event", base: bench + "bare-pg-producer-µs/event",
		value: ratio, op: "<=", limit: 0.5,
		reached: []string{bench + "bare-events/s", bench + "poll-events/s", bench + "logical-events/s"}, asked: float64(rate),
	}
}

// shortOf reports the lowest load reached by a contender below 95% of
// t.asked in some iteration, and whether there was one.
func (t target) shortOf(r *run) (float64, bool) {
	low, short := t.asked, false
	for _, k := range t.reached {
		for _, v := range r.samples[k] {
			if v < 0.95*t.asked {
				low, short = min(low, v), true
			}
		}
	}
	return low, short
}

// figure computes t's figure from the run's medians; false when the run
// lacks a metric it needs.
func (t target) figure(r *run) (float64, bool) {
	if prefix, unit, ok := strings.Cut(t.num, "/* "); ok {
		// The largest of the sub-benchmarks' medians: the worst input.
		worst, any := 0.0, false
		for _, k := range r.keys() {
			name, u, _ := strings.Cut(k, " ")
			if u == unit && strings.HasPrefix(name, prefix+"/") {
				worst, any = max(worst, r.median(k)), true
			}
		}
		return worst, any
	}
	if len(r.samples[t.num]) == 0 {
		return 0, false
	}
	v := r.median(t.num)
	if t.den == "" {
		return v, true
	}
	if len(r.samples[t.den]) == 0 {
		return 0, false
	}
	d := r.median(t.den)
	if t.base != "" {
		if len(r.samples[t.base]) == 0 {
			return 0, false
		}
		base := r.median(t.base)
		v, d = v-base, d-base
	}
	if d == 0 || t.base != "" && d < 0 {
		return 0, false // no part of the peer's to compare with
	}
	return t.value(v, d), true
}

// cells are the metrics shown beside t's figure on the results page:
// oncekit's, the peer's and the raw limit's, each "" when t shows none.
func (t target) cells() (oncekit, peer, raw string) {
	if t.rate == "" {
		return "", "", ""
	}
	bench, rest, _ := strings.Cut(t.num, "/")
	sub, _, _ := strings.Cut(rest, " ")
	metric := func(name string) string {
		if name == "" {
			return ""
		}
		return bench + "/" + name + " " + t.rate
	}
	return metric(sub), metric(t.peer), metric(t.raw)
}

// judge is t's verdict on v in run r: MISS as well when a contender did
// not reach the load asked.
func (t target) judge(r *run, v float64) string {
	if _, short := t.shortOf(r); short {
		return "MISS"
	}
	return t.verdict(v)
}

// verdict is PASS when v meets t's target, else MISS.
func (t target) verdict(v float64) string {
	pass := v >= t.limit
	if t.op == "<=" {
		pass = v <= t.limit
	}
	if pass {
		return "PASS"
	}
	return "MISS"
}
