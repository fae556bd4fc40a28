package outbox

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the relay's Prometheus series (namespace oncekit, subsystem
// outbox). With a nil registerer they are created but never exported.
type metrics struct {
	reg       prometheus.Registerer
	published prometheus.Counter
	failures  *prometheus.CounterVec
	batch     prometheus.Histogram
	lag       prometheus.Histogram
	oldest    prometheus.Gauge
	parked    prometheus.Gauge
	owned     prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "oncekit", "outbox"
	m := &metrics{
		reg: reg,
		published: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "published_total", Help: "Messages the broker acknowledged and the relay marked published."}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "publish_failures_total", Help: "Failed publishes, by kind: message (counted as an attempt) or broker (broker unreachable)."},
			[]string{"kind"}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "batch_size", Help: "Rows read per batch.", Buckets: prometheus.ExponentialBuckets(1, 4, 8)}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "lag_seconds", Help: "Time from enqueue to broker acknowledgement.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)}),
		oldest: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "oldest_unpublished_age_seconds", Help: "Age of the oldest unpublished, unparked message."}),
		parked: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "parked", Help: "Messages parked after too many failed attempts."}),
		owned: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "partitions_owned", Help: "Partitions this relay holds a lease on."}),
	}
	m.failures.WithLabelValues("message")
	m.failures.WithLabelValues("broker")
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.published, m.failures, m.batch, m.lag, m.oldest, m.parked, m.owned} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("outbox: RelayConfig.Registerer: metrics already registered (one relay per registerer): %w", err)
			}
			return nil, fmt.Errorf("outbox: RelayConfig.Registerer: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) setOwned(n int) { m.owned.Set(float64(n)) }
