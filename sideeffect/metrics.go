package sideeffect

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit/internal/promshare"
)

// metrics are the dispatcher's Prometheus collectors. Labels are bounded:
// kind takes only the kinds the dispatcher has providers for.
type metrics struct {
	transitions      *prometheus.CounterVec   // kind, state
	firedToConfirmed *prometheus.HistogramVec // kind
	attempts         *prometheus.HistogramVec // kind, state (terminal or unknown)
	unknown          *prometheus.GaugeVec     // kind
	duplicates       *prometheus.CounterVec   // kind
	calls            *prometheus.CounterVec   // kind, outcome
	callSeconds      *prometheus.HistogramVec // kind
	statementErrors  *prometheus.CounterVec   // statement (sync, recovery), class (pgsql.BrokenClass)
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "oncekit", "sideeffect"
	m := &metrics{
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "transitions_total", Help: "Effects moved into a state, by kind and new state."}, []string{"kind", "state"}),
		firedToConfirmed: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "fired_to_confirmed_seconds", Help: "Time from the last fired commit to the confirmed commit.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)}, []string{"kind"}),
		attempts: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "attempts", Help: "Calls made for an effect when it reached confirmed, failed or unknown.",
			Buckets: []float64{1, 2, 3, 5, 8, 13, 21}}, []string{"kind", "state"}),
		unknown: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "unknown_effects", Help: "Effects in state unknown (waiting for an operator), refreshed by the recovery loop."}, []string{"kind"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "provider_duplicates_total", Help: "Calls the provider reported as a replay of an earlier call with the same key."}, []string{"kind"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "provider_calls_total", Help: "Provider calls by outcome (ok, duplicate, definite, indefinite) and lookups (lookup_found, lookup_missing, lookup_error)."}, []string{"kind", "outcome"}),
		callSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "provider_call_seconds", Help: "Duration of provider calls.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10)}, []string{"kind"}),
		statementErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "statement_errors_total", Help: "Failures of the dispatcher's statements that sending again cannot cure (a missing grant, an undefined table or column, a read-only server, an argument the driver cannot encode), by statement (sync: claims and outcomes; recovery) and SQLSTATE class (client: refused by the driver). The dispatcher retries after its poll interval."},
			[]string{"statement", "class"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error // several dispatchers on one registry share the series
	m.transitions = promshare.Register(reg, m.transitions, &err)
	m.firedToConfirmed = promshare.Register(reg, m.firedToConfirmed, &err)
	m.attempts = promshare.Register(reg, m.attempts, &err)
	m.unknown = promshare.Register(reg, m.unknown, &err)
	m.duplicates = promshare.Register(reg, m.duplicates, &err)
	m.calls = promshare.Register(reg, m.calls, &err)
	m.callSeconds = promshare.Register(reg, m.callSeconds, &err)
	m.statementErrors = promshare.Register(reg, m.statementErrors, &err)
	return m, err
}

// kindMetrics holds one kind's collectors of the path every effect takes
// (fired, called, confirmed), looked up once instead of per effect.
type kindMetrics struct {
	fired, confirmed prometheus.Counter
	callsOK          prometheus.Counter
	callSeconds      prometheus.Observer
	toConfirmed      prometheus.Observer
	attemptsOK       prometheus.Observer
}

func (m *metrics) forKind(kind string) *kindMetrics {
	return &kindMetrics{
		fired:       m.transitions.WithLabelValues(kind, string(StateFired)),
		confirmed:   m.transitions.WithLabelValues(kind, string(StateConfirmed)),
		callsOK:     m.calls.WithLabelValues(kind, "ok"),
		callSeconds: m.callSeconds.WithLabelValues(kind),
		toConfirmed: m.firedToConfirmed.WithLabelValues(kind),
		attemptsOK:  m.attempts.WithLabelValues(kind, string(StateConfirmed)),
	}
}
