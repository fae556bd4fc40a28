package inbox

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit/internal/promshare"
)

// metrics are the consumer's Prometheus series, labelled by consumer only.
type metrics struct {
	processed, duplicates, retried prometheus.Counter
	terminated                     prometheus.Counter
	deadLettered                   *prometheus.CounterVec // label reason: permanent, max_attempts, no_id, invalid_id, unauthenticated
	statementErrors                *prometheus.CounterVec // labels statement (claim, commit, dead_letter), class (pgsql.BrokenClass)
	handlerSeconds                 prometheus.Observer
	batchSize                      prometheus.Observer
	hitRatio                       prometheus.Gauge
	inHand, oldestInHand           prometheus.Gauge

	nProcessed, nDuplicates atomic.Int64
}

// register registers c, or returns the collector already registered under
// the same description, so that several consumers can share a registerer.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	var err error
	c = promshare.Register(reg, c, &err)
	if err != nil {
		panic(err)
	}
	return c
}

func newMetrics(reg prometheus.Registerer, consumer string) *metrics {
	if reg == nil {
		reg = prometheus.NewRegistry() // counted, never exported
	}
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "oncekit", Subsystem: "inbox", Name: name, Help: help}
	}
	counter := func(name, help string) prometheus.Counter {
		return register(reg, prometheus.NewCounterVec(prometheus.CounterOpts(opts(name, help)), []string{"consumer"})).WithLabelValues(consumer)
	}
	hist := func(name, help string, buckets []float64) prometheus.Observer {
		return register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "oncekit", Subsystem: "inbox", Name: name, Help: help, Buckets: buckets,
		}, []string{"consumer"})).WithLabelValues(consumer)
	}
	dead := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts(opts("dead_lettered_total",
		"Messages written to dead_letters, by reason (permanent, max_attempts, no_id, invalid_id, unauthenticated).")), []string{"consumer", "reason"}))
	stmtErrs := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts(opts("statement_errors_total",
		"Failures of the consumer's own statements that sending again cannot cure (a missing grant, an undefined table or column, a read-only server, an argument the driver cannot encode), by statement (claim, commit, dead_letter) and SQLSTATE class (client: refused by the driver). The messages are retried, never acked.")),
		[]string{"consumer", "statement", "class"}))
	gauge := func(name, help string) prometheus.Gauge {
		return register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts(opts(name, help)), []string{"consumer"})).WithLabelValues(consumer)
	}
	return &metrics{
		processed:  counter("processed_total", "Messages whose handler committed."),
		duplicates: counter("duplicates_total", "Messages acknowledged as duplicates of an existing claim."),
		retried:    counter("retried_total", "Handler failures scheduled for redelivery."),
		terminated: counter("terminated_total",
			"Messages given up on without a dead letter, because PostgreSQL refused even a minimal one: terminated at the broker and logged at error level."),
		deadLettered:    dead.MustCurryWith(prometheus.Labels{"consumer": consumer}),
		statementErrors: stmtErrs.MustCurryWith(prometheus.Labels{"consumer": consumer}),
		handlerSeconds:  hist("handler_seconds", "Time spent in the handler per message.", prometheus.ExponentialBuckets(0.0001, 4, 10)),
		batchSize:       hist("batch_size", "Messages per processing transaction.", prometheus.ExponentialBuckets(1, 2, 11)),
		hitRatio:        gauge("dedup_hit_ratio", "Duplicates / (processed + duplicates) since the consumer started."),
		inHand: gauge("in_hand",
			"Messages received and not yet settled with the broker (queued, at work or waiting for a retry), at the last progress signal."),
		oldestInHand: gauge("oldest_in_hand_seconds",
			"Age of the oldest message received and not yet settled with the broker, at the last progress signal: a stuck handler makes it grow."),
	}
}

func (m *metrics) addProcessed(n int) {
	if n > 0 {
		m.processed.Add(float64(n))
		m.nProcessed.Add(int64(n))
	}
}

func (m *metrics) addDuplicates(n int) {
	if n > 0 {
		m.duplicates.Add(float64(n))
		m.nDuplicates.Add(int64(n))
	}
}

func (m *metrics) updateRatio() {
	p, d := m.nProcessed.Load(), m.nDuplicates.Load()
	if p+d > 0 {
		m.hitRatio.Set(float64(d) / float64(p+d))
	}
}

// Metrics records a consumer's inbox series (namespace oncekit, subsystem
// inbox, label consumer) for code that claims through a Store outside a
// Consumer, such as the watermill router handlers (package aspubsub): the
// series a Consumer reports, so that one dashboard covers both. Several may
// share a registerer.
type Metrics struct{ m *metrics }

// NewMetrics returns consumer's series on reg; a nil reg counts without
// exporting.
func NewMetrics(reg prometheus.Registerer, consumer string) *Metrics {
	return &Metrics{m: newMetrics(reg, consumer)}
}

// Processed counts a message whose handler committed.
func (m *Metrics) Processed() { m.m.addProcessed(1); m.m.updateRatio() }

// Duplicate counts a message acknowledged as a duplicate of a claim.
func (m *Metrics) Duplicate() { m.m.addDuplicates(1); m.m.updateRatio() }

// Retried counts a failure handed back to the broker for redelivery.
func (m *Metrics) Retried() { m.m.retried.Inc() }

// DeadLettered counts a dead letter. kind is one of the Consumer's reason
// labels: "permanent", "max_attempts", "no_id" or "invalid_id".
func (m *Metrics) DeadLettered(kind string) { m.m.deadLettered.WithLabelValues(kind).Inc() }

// HandlerSeconds observes the time one handler call took.
func (m *Metrics) HandlerSeconds(seconds float64) { m.m.handlerSeconds.Observe(seconds) }
