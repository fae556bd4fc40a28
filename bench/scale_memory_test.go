package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// fillPendingOutbox adds the rows fillOutbox does, but enqueued by the fill's
// own transaction and not yet published: a relay's backlog.
var fillPendingOutbox = strings.Replace(fillOutbox, "gen_random_uuid(), '1',", "gen_random_uuid(), pg_current_xact_id(),", 1)

// fillPendingEffects adds "order.paid" effects due now, never fired: a
// dispatcher's backlog.
const fillPendingEffects = `
INSERT INTO side_effects (source_id, kind, payload, idempotency_key)
SELECT 'backlog-' || g, 'order.paid', decode(repeat(md5(g::text), 8), 'hex'),
	encode(sha256(convert_to('backlog-' || g || '/order.paid', 'UTF8')), 'hex')
FROM generate_series($1::bigint, $2::bigint - 1) g`

// BenchmarkScaleMemory runs each daemon as a process of its own (`oncekit
// relay`, `oncekit dispatch`, and bench/cmd/benchconsumer for the inbox
// consumer, which has no command) over a backlog of ONCEKIT_SCALE_MEMORY_ROWS
// (default 1,000,000) rows or messages until it has drained it, and reports
// its peak RSS (VmHWM in /proc/PID/status, read before it is stopped) in
// peak-rss-MiB, the backlog, and the drain's rows/s.
func BenchmarkScaleMemory(b *testing.B) {
	rows := envInt("ONCEKIT_SCALE_MEMORY_ROWS", 1_000_000)
	b.Run("relay", func(b *testing.B) {
		for range b.N {
			db, nats := testenv.NewDB(b), testenv.NewNATS(b)
			ctx := context.Background()
			stream, err := natsjs.EnsureStream(ctx, nats.JS, natsjs.StreamConfig{Name: "scale_memory", Subjects: []string{"scale.>"}})
			if err != nil {
				b.Fatal(err)
			}
			fill(b, db, "outbox", fillPendingOutbox, 0, rows, rows)
			ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
			if err != nil {
				b.Fatal(err)
			}
			cmd := exec.Command(testenv.OncekitBinary(b), "relay", "--database-url", db.URL, "--schema", db.Schema,
				"--nats-url", nats.URL, "--retention=-1s", "--log-level", "warn")
			daemonMemory(b, cmd, rows, func() (bool, error) {
				left, err := ob.Backlog(ctx, db.Pool)
				if err != nil || left.Pending > 0 {
					return false, err
				}
				// Drained means published: the stream holds the backlog.
				info, err := stream.Info(ctx)
				return err == nil && info.State.Msgs >= uint64(rows), err
			})
			db.Close()
			nats.Close()
		}
	})
	b.Run("consumer", func(b *testing.B) {
		bin := filepath.Join(b.TempDir(), "benchconsumer")
		if out, err := exec.Command("go", "build", "-o", bin, "./cmd/benchconsumer").CombinedOutput(); err != nil {
			b.Fatalf("go build ./cmd/benchconsumer: %v\n%s", err, out)
		}
		for range b.N {
			env := newKeyedConsumeEnv(b, rows, 0)
			ctx := context.Background()
			cmd := exec.Command(bin, "-database-url", env.db.URL, "-schema", env.db.Schema, "-nats-url", env.nats.URL, "-stream", env.stream)
			daemonMemory(b, cmd, rows, func() (bool, error) {
				c, err := env.nats.JS.Consumer(ctx, env.stream, "benchconsumer")
				if err != nil {
					return false, nil // not created yet
				}
				info, err := c.Info(ctx)
				return err == nil && info.Delivered.Consumer >= uint64(rows) && info.NumPending == 0 && info.NumAckPending == 0, err
			})
			env.check(b)
			env.close()
		}
	})
	b.Run("dispatcher", func(b *testing.B) {
		for range b.N {
			db := testenv.NewDB(b)
			srv := newDispatchProvider(b)
			fill(b, db, "side_effects", fillPendingEffects, 0, rows, rows)
			ctx := context.Background()
			cmd := exec.Command(testenv.OncekitBinary(b), "dispatch", "--database-url", db.URL, "--schema", db.Schema,
				"--endpoint", "order.paid="+srv.URL, "--secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
				"--concurrency", "64", "--listen", "", "--retention=-1s", "--log-level", "warn")
			daemonMemory(b, cmd, rows, func() (bool, error) {
				if srv.effects.Load() < int64(rows) {
					return false, nil
				}
				var due int
				err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM side_effects WHERE next_attempt_at IS NOT NULL`).Scan(&due)
				return err == nil && due == 0, err
			})
			if got := srv.calls.Load(); got != int64(rows) {
				b.Fatalf("provider called %d times, want %d", got, rows)
			}
			srv.release()
			db.Close()
		}
	})
}

// daemonMemory starts cmd, polls drained every 100 ms until it reports the
// backlog of rows gone (within 30 minutes), reads the process's peak RSS,
// stops it with SIGTERM, and reports the figures.
func daemonMemory(b *testing.B, cmd *exec.Cmd, rows int, drained func() (bool, error)) {
	b.Helper()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Minute)
	for done := false; !done; {
		select {
		case err := <-exited:
			b.Fatalf("%s exited before draining: %v\n%s", cmd.Args[0], err, stderr.String())
		case <-deadline:
			_ = cmd.Process.Kill()
			b.Fatalf("%s did not drain %d rows within 30 minutes", cmd.Args[0], rows)
		case <-tick.C:
			var err error
			if done, err = drained(); err != nil {
				b.Fatal(err)
			}
		}
	}
	elapsed := time.Since(start)
	peak, err := peakRSS(cmd.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		<-exited
	}
	b.ReportMetric(peak, "peak-rss-MiB")
	b.ReportMetric(float64(rows), "backlog")
	b.ReportMetric(float64(rows)/elapsed.Seconds(), "rows/s")
	b.ReportMetric(0, "ns/op")
}

// peakRSS is the peak resident set size of process pid in MiB (VmHWM).
func peakRSS(pid int) (float64, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}
