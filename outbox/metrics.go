package outbox

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit/internal/promshare"
)

// metrics are the relay's Prometheus series (namespace oncekit, subsystem
// outbox). With a nil registerer they are created but never exported.
type metrics struct {
	reg       prometheus.Registerer
	published prometheus.Counter
	failures  *prometheus.CounterVec
	// statementErrors: labels statement (batch, heartbeat, renew,
	// acquire) and class (pgsql.BrokenClass).
	statementErrors *prometheus.CounterVec
	batch, lag      prometheus.Histogram // per batch, per message
	oldest, parked  prometheus.Gauge     // at the last stats refresh
	owned           prometheus.Gauge     // as leases are taken and lost
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "oncekit", "outbox"
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	m := &metrics{
		reg: reg,
		published: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "published_total", Help: "Messages the broker acknowledged and the relay marked published."}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "publish_failures_total", Help: "Failed publishes, by kind: message (counted as an attempt) or broker (broker unreachable)."},
			[]string{"kind"}),
		statementErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "statement_errors_total", Help: "Failures of the relay's statements that sending again cannot cure (a missing grant, an undefined table or column, a read-only server, an argument the driver cannot encode), by statement (batch, heartbeat, renew, acquire) and SQLSTATE class (client: refused by the driver). The relay backs off and retries."},
			[]string{"statement", "class"}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "batch_size", Help: "Rows read per batch.", Buckets: prometheus.ExponentialBuckets(1, 4, 8)}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "lag_seconds", Help: "Time from enqueue to broker acknowledgement.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)}),
		oldest: gauge("oldest_unpublished_age_seconds", "Age of the oldest unpublished, unparked message."),
		parked: gauge("parked", "Messages parked after too many failed attempts."),
		owned:  gauge("partitions_owned", "Partitions this relay holds a lease on."),
	}
	m.failures.WithLabelValues("message")
	m.failures.WithLabelValues("broker")
	if err := promshare.RegisterAlone(reg, "outbox: RelayConfig.Registerer", "relay",
		m.published, m.failures, m.statementErrors, m.batch, m.lag, m.oldest, m.parked, m.owned); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *metrics) setOwned(n int) { m.owned.Set(float64(n)) }
