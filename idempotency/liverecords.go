package idempotency

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit/internal/pgsql"
)

// maxLiveOperations bounds the operation label of
// oncekit_idempotency_live_records: the records of the operations beyond
// the largest maxLiveOperations are summed under otherOperation.
const maxLiveOperations = 50

// otherOperation labels the records of the operations beyond the cap.
const otherOperation = "_other"

// liveRecordsSQL counts the records that still hold their key, per
// operation and state.
const liveRecordsSQL = `
SELECT operation, state, count(*)
FROM {schema}.idempotency_keys WHERE ` + live + `
GROUP BY operation, state`

// newLiveRecords returns the gauge of live records, by operation and
// state.
func newLiveRecords() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "oncekit", Subsystem: "idempotency",
		Name: "live_records",
		Help: "Records holding their key (in progress, unknown, or completed and released ones before their KeyTTL) at the last Prune, by operation (the 50 largest; the rest as _other) and state."},
		[]string{"operation", "state"})
}

// liveCount is one row of liveRecordsSQL.
type liveCount struct {
	operation, state string
	n                int64
}

// measureLive refreshes oncekit_idempotency_live_records.
func (e *Edge) measureLive(ctx context.Context) error {
	rows, err := e.db.Query(ctx, pgsql.Render(liveRecordsSQL, e.cfg.Schema))
	if err != nil {
		return fmt.Errorf("idempotency: prune: count live records: %w", err)
	}
	got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (liveCount, error) {
		var c liveCount
		err := row.Scan(&c.operation, &c.state, &c.n)
		return c, err
	})
	if err != nil {
		return fmt.Errorf("idempotency: prune: count live records: %w", err)
	}
	e.m.live.Reset()
	for _, c := range capOperations(got, maxLiveOperations) {
		e.m.live.WithLabelValues(c.operation, c.state).Set(float64(c.n))
	}
	return nil
}

// capOperations keeps the counts of the limit operations with the most
// records and sums the others' per state under otherOperation.
func capOperations(counts []liveCount, limit int) []liveCount {
	totals := map[string]int64{}
	for _, c := range counts {
		totals[c.operation] += c.n
	}
	if len(totals) <= limit {
		return counts
	}
	ops := make([]string, 0, len(totals))
	for op := range totals {
		ops = append(ops, op)
	}
	slices.SortFunc(ops, func(a, b string) int { return cmp.Or(cmp.Compare(totals[b], totals[a]), cmp.Compare(a, b)) })
	kept := map[string]bool{}
	for _, op := range ops[:limit] {
		kept[op] = true
	}
	var out []liveCount
	other := map[string]int64{}
	for _, c := range counts {
		if kept[c.operation] {
			out = append(out, c)
		} else {
			other[c.state] += c.n
		}
	}
	for state, n := range other {
		out = append(out, liveCount{operation: otherOperation, state: state, n: n})
	}
	return out
}
