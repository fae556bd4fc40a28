package drift

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	value *prometheus.GaugeVec
	drift *prometheus.GaugeVec
	runs  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		value: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "oncekit", Subsystem: "drift", Name: "value",
			Help: "Figure measured by each drift check at its last run (count, or seconds for ages).",
		}, []string{"check"}),
		drift: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "oncekit", Subsystem: "drift", Name: "findings",
			Help: "1 when the check found drift at its last run, else 0.",
		}, []string{"check"}),
		runs: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "oncekit", Subsystem: "drift", Name: "runs_total",
			Help: "Completed drift runs.",
		}),
	}
	for _, c := range []prometheus.Collector{m.value, m.drift, m.runs} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				continue
			}
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) observe(r Report) {
	for _, f := range r.Findings {
		m.value.WithLabelValues(f.Check).Set(f.Value)
		d := 0.0
		if f.Drift {
			d = 1
		}
		m.drift.WithLabelValues(f.Check).Set(d)
	}
	m.runs.Inc()
}
