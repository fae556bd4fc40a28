package bench

import (
	"context"
	"testing"
	"time"

	"github.com/oncekit/oncekit/internal/testenv"
)

// retentionUnderLoad runs t's retention over the backlog filled in db while
// t's first hot path runs paced at 80% of its empty rate (empty, measured
// just before in the same iteration), and reports: deleted-rows/s over the
// whole deletion; hot-rate and hot-x, the hot path's rate during the
// deletion and its ratio to the same paced run made just before without
// retention (hot-p99-ms and hot-p99-x where the path measures latencies);
// and deleted, the rows deleted (fewer than filled when the deletion hit
// ONCEKIT_SCALE_RETENTION_MAX).
func retentionUnderLoad(b *testing.B, cfg scaleConfig, t scaleTable, db *testenv.DB, empty figure) {
	b.Helper()
	p := t.paths[0]
	target := 0.8 * empty.rate()
	quietCtx, quietDone := context.WithTimeout(context.Background(), time.Duration(cfg.seconds)*time.Second)
	quiet := pacedRun(b, p, db, target, quietCtx.Done())
	quietDone()

	ctx, cancel := context.WithTimeout(context.Background(), cfg.retentionMax)
	defer cancel()
	retain := t.retain(b, db)
	done := make(chan struct{})
	var deleted int64
	var err error
	start := time.Now()
	var took time.Duration
	go func() {
		defer close(done)
		deleted, err = retain(ctx)
		took = time.Since(start)
	}()
	loaded := pacedRun(b, p, db, target, done)
	<-done
	if err != nil && ctx.Err() == nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(deleted)/took.Seconds(), "deleted-rows/s")
	b.ReportMetric(float64(deleted), "deleted")
	b.ReportMetric(loaded.rate(), "hot-rate")
	b.ReportMetric(loaded.rate()/quiet.rate(), "hot-x")
	if len(loaded.lat) > 0 && len(quiet.lat) > 0 {
		b.ReportMetric(loaded.pct(0.99), "hot-p99-ms")
		b.ReportMetric(loaded.pct(0.99)/quiet.pct(0.99), "hot-p99-x")
	}
	b.ReportMetric(0, "ns/op")
}

// pacedRun runs p on db in measurements of about one second's work at
// rate each, starting one no sooner than the previous one's share of the
// rate allows, until stop closes (a measurement under way finishes), and
// returns their sum: the rate of the timed parts, and their latencies.
func pacedRun(b *testing.B, p scalePath, db *testenv.DB, rate float64, stop <-chan struct{}) figure {
	b.Helper()
	chunk := max(int(rate), 100)
	slot := time.Duration(float64(chunk) / rate * float64(time.Second))
	var sum figure
	for {
		start := time.Now()
		sum.add(p.measure(b, db, chunk))
		select {
		case <-stop:
			return sum
		default:
		}
		select {
		case <-stop:
			return sum
		case <-time.After(slot - time.Since(start)):
		}
	}
}
