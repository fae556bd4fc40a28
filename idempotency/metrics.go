package idempotency

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit/internal/promshare"
)

// Outcomes counted in oncekit_idempotency_requests_total.
const (
	OutcomeNew                = "new"                  // key claimed, handler ran
	OutcomeRecovered          = "recovered"            // expired in_progress claim taken over, handler re-ran
	OutcomeReplayed           = "replayed"             // stored response replayed
	OutcomeConflictInProgress = "conflict_in_progress" // 409: the key's first request still runs
	OutcomeMismatch           = "mismatch"             // 422: key reused with another request
	OutcomeMissingKey         = "missing_key"          // 400: required key absent
	OutcomeInvalidKey         = "invalid_key"          // 400: malformed key
	OutcomeBypass             = "bypass"               // optional route, no key: handler ran unguarded
	OutcomeRejected           = "rejected"             // tenant rejected or body too large: no record
	OutcomeError              = "error"                // the store failed
	OutcomeExpired            = "expired"              // 422: a retry after its response expired (TTL), before KeyTTL
	OutcomeRateLimited        = "rate_limited"         // 429: a new key over its scope's NewKeysPerMinute: nothing stored
	OutcomeUnknown            = "unknown"              // 409: the request's outcome is unknown (Unknown), until settled
	OutcomeReconciled         = "reconciled"           // a request in doubt (InDoubt) given to Route.UnknownOutcomes.Reconcile
	OutcomeBusinessKey        = "business_key"         // a new key with a known business key: the first operation's answer
	OutcomeOutdated           = "outdated"             // 422: ResponseVersions.Upgrade refused a stored response's version
	OutcomeForwarded          = "forwarded"            // sent to the scope's home region (Route.Homing)
	OutcomeMisdirected        = "misdirected"          // 421: outside the scope's home region, not forwarded
)

type metrics struct {
	requests     *prometheus.CounterVec
	stored       *prometheus.CounterVec
	released     *prometheus.CounterVec
	fenced       *prometheus.CounterVec
	conflictAge  *prometheus.HistogramVec
	inProgress   prometheus.Gauge
	oldestAge    prometheus.Gauge
	cleanedTotal prometheus.Counter
	cleanupLag   prometheus.Gauge
	unknown      *prometheus.CounterVec
	reconciled   *prometheus.CounterVec
	unsettled    *prometheus.GaugeVec
	unsettledAge *prometheus.GaugeVec
	// statementErrors: labels statement (store) and class
	// (pgsql.BrokenClass).
	statementErrors *prometheus.CounterVec
	// keyQuality: labels operation and kind (keyKind).
	keyQuality *prometheus.CounterVec
	// live: labels operation (capped) and state.
	live *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "oncekit", "idempotency"
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "requests_total", Help: "Requests through the idempotency middleware, by operation and outcome."},
			[]string{"operation", "outcome"}),
		stored: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "records_stored_total", Help: "Responses stored for replay, by operation."},
			[]string{"operation"}),
		released: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "records_released_total", Help: "Claims released without storing (5xx, 401, 403, 429, panics), by operation."},
			[]string{"operation"}),
		fenced: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "fenced_total", Help: "Responses not stored because another request had recovered the claim, by operation."},
			[]string{"operation"}),
		conflictAge: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "in_progress_age_seconds", Help: "Age of the in_progress record a conflicting request met, by operation.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 8)},
			[]string{"operation"}),
		inProgress: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "in_progress_records", Help: "Records in_progress at the last Prune."}),
		oldestAge: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "in_progress_oldest_age_seconds", Help: "Age of the oldest in_progress record at the last Prune."}),
		cleanedTotal: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "cleanup_deleted_total", Help: "Expired completed and released records deleted by Prune."}),
		cleanupLag: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "cleanup_lag_seconds", Help: "How long the oldest expired record had waited for deletion at the end of the last Prune (0: none)."}),
		unknown: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "unknown_outcomes_total", Help: "Requests whose handler or reconciliation left the outcome unknown, by operation."},
			[]string{"operation"}),
		reconciled: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "reconciled_total", Help: "Requests in doubt given to Route.UnknownOutcomes.Reconcile, by operation and verdict (settled, run_again, still_unknown)."},
			[]string{"operation", "verdict"}),
		unsettled: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "unsettled_records", Help: "Records waiting for an outcome at the last Prune, by operation and state (in_progress, unknown)."},
			[]string{"operation", "state"}),
		unsettledAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "unsettled_oldest_age_seconds", Help: "Age of the oldest record waiting for an outcome at the last Prune, by operation and state."},
			[]string{"operation", "state"}),
		statementErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "statement_errors_total", Help: "Requests answered 503 because PostgreSQL refused the edge's statement as sent (a missing grant, an undefined table or column, a read-only server, an argument the driver cannot encode), by statement (store) and SQLSTATE class (client: refused by the driver)."},
			[]string{"statement", "class"}),
		keyQuality: newKeyQuality(),
		live:       newLiveRecords(),
	}
	if err := promshare.RegisterAlone(reg, "idempotency: Config.Registerer", "Edge",
		m.requests, m.stored, m.released, m.fenced, m.conflictAge, m.inProgress, m.oldestAge, m.cleanedTotal, m.cleanupLag,
		m.unknown, m.reconciled, m.unsettled, m.unsettledAge, m.statementErrors, m.keyQuality, m.live); err != nil {
		return nil, err
	}
	return m, nil
}
