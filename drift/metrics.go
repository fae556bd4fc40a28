package drift

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit/internal/promshare"
)

type metrics struct {
	value, drift, failed *prometheus.GaugeVec
	runs                 prometheus.Counter
	lastRun              prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	var err error // checkers sharing a registerer share the series
	gauge := func(name, help string) *prometheus.GaugeVec {
		return promshare.Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "oncekit", Subsystem: "drift", Name: name, Help: help,
		}, []string{"check"}), &err)
	}
	m := &metrics{
		value:  gauge("value", "Figure measured by each drift check at its last run (count, or seconds for ages)."),
		drift:  gauge("findings", "1 when the check found drift at its last run, else 0."),
		failed: gauge("check_failed", "1 when the check could not run at its last run (timed out, failed), else 0."),
		runs: promshare.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "oncekit", Subsystem: "drift", Name: "runs_total",
			Help: "Completed drift runs.",
		}), &err),
		lastRun: promshare.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "oncekit", Subsystem: "drift", Name: "last_run_timestamp_seconds",
			Help: "Unix time of the last completed drift run.",
		}), &err),
	}
	return m, err
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (m *metrics) observe(r Report) {
	for _, f := range r.Findings {
		m.failed.WithLabelValues(f.Check).Set(b2f(f.Failed()))
		if f.Failed() {
			continue // the last figure measured stays; check_failed says it is stale
		}
		m.value.WithLabelValues(f.Check).Set(f.Value)
		m.drift.WithLabelValues(f.Check).Set(b2f(f.Drift))
	}
	m.runs.Inc()
	m.lastRun.Set(float64(r.At.Unix()))
}
