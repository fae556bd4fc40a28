package bench

import (
	"context"
	"testing"
	"time"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// retentionUnderLoad runs the retention pass retain over the backlog filled
// in db while the hot path p runs paced at 80% of its empty rate (empty, measured
// just before in the same iteration; its capacity, since the work that
// feeds the path shares the machine), and reports:
//   - deleted-rows/s over the whole deletion, and deleted, the rows deleted
//     (fewer than filled when the deletion hit ONCEKIT_SCALE_RETENTION_MAX);
//   - hot-target, the paced rate, and hot-quiet-x, the share of it the paced
//     run made just before without retention kept;
//   - hot-rate and hot-x, the rate the hot path kept during the deletion
//     (its work over the wall time) and its ratio to that run's;
//   - hot-busy-x, the same ratio of its speed while at work, which counts
//     the slowdown the pacing's idle time absorbs;
//   - hot-p99-ms and hot-p99-x where the path measures latencies;
//   - checkpoints, the checkpoints the server began during the deletion
//     (its hot paths pay a full-page image for each page they first touch
//     after one begins).
func retentionUnderLoad(b *testing.B, cfg scaleConfig, p scalePath, retain func(context.Context) (int64, error),
	db *testenv.DB, empty figure) {
	b.Helper()
	target := 0.8 * empty.capacity()
	quietCtx, quietDone := context.WithTimeout(context.Background(), time.Duration(cfg.seconds)*time.Second)
	quiet := pacedRun(b, p, db, target, quietCtx.Done())
	quietDone()

	ctx, cancel := context.WithTimeout(context.Background(), cfg.retentionMax)
	defer cancel()
	checkpointsBefore := checkpoints(b, db)
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
	b.ReportMetric(float64(checkpoints(b, db)-checkpointsBefore), "checkpoints")
	b.ReportMetric(float64(deleted)/took.Seconds(), "deleted-rows/s")
	b.ReportMetric(float64(deleted), "deleted")
	b.ReportMetric(target, "hot-target")
	b.ReportMetric(quiet.kept()/target, "hot-quiet-x")
	b.ReportMetric(loaded.kept(), "hot-rate")
	b.ReportMetric(loaded.kept()/quiet.kept(), "hot-x")
	b.ReportMetric(loaded.rate()/quiet.rate(), "hot-busy-x")
	if len(loaded.lat) > 0 && len(quiet.lat) > 0 {
		b.ReportMetric(loaded.pct(0.99), "hot-p99-ms")
		b.ReportMetric(loaded.pct(0.99)/quiet.pct(0.99), "hot-p99-x")
	}
	b.ReportMetric(0, "ns/op")
}

// pacedFigure is a paced run's figure: the sum of its measurements (their
// rate is the hot path's speed while at work) and the run's wall time.
type pacedFigure struct {
	figure
	wall time.Duration // from the first measurement's start to the end of the last one's slot, or of the measurement if later
}

// kept is the rate the paced run kept: the work done over the wall time.
func (f pacedFigure) kept() float64 { return float64(f.units) / f.wall.Seconds() }

// pacedRun runs p on db in measurements of about one second's work at
// rate each, starting one no sooner than the previous one's share of the
// rate allows, until stop closes (a measurement under way finishes), and
// returns their sum and the run's wall time.
func pacedRun(b *testing.B, p scalePath, db *testenv.DB, rate float64, stop <-chan struct{}) pacedFigure {
	b.Helper()
	chunk := max(int(rate), 100)
	slot := time.Duration(float64(chunk) / rate * float64(time.Second))
	var sum pacedFigure
	begin := time.Now()
	for slots := 1; ; slots++ {
		start := time.Now()
		sum.add(p.measureOn(b, db, chunk))
		select {
		case <-stop:
		default: // not stopped yet: wait for the next slot, unless stop closes first
			select {
			case <-stop:
			case <-time.After(slot - time.Since(start)):
				continue
			}
		}
		sum.wall = max(time.Since(begin), time.Duration(slots)*slot)
		return sum
	}
}

// checkpoints returns how many checkpoints the server has begun since its
// statistics were reset: pg_stat_bgwriter's count before PostgreSQL 17,
// pg_stat_checkpointer's since.
func checkpoints(b *testing.B, db *testenv.DB) int64 {
	b.Helper()
	ctx := context.Background()
	var n int64
	err := db.Pool.QueryRow(ctx, `SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter`).Scan(&n)
	if err != nil {
		err = db.Pool.QueryRow(ctx, `SELECT num_timed + num_requested FROM pg_stat_checkpointer`).Scan(&n)
	}
	if err != nil {
		b.Fatal(err)
	}
	return n
}
