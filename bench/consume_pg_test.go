package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// BenchmarkConsumePG runs the inbox consumer on one PostgreSQL connection
// with an in-memory source (no broker), to price the PostgreSQL side alone:
// besides msgs/s it reports the CPU the PostgreSQL backend spent per message
// (pg-µs/msg, read from /proc when PostgreSQL runs on this machine) and this
// process's (go-cpu-µs/msg: the consumer alone, as the source is a slice),
// which other load on the machine disturbs less. The contenders are the
// consumer's modes: oncekit-batch (BatchSize 200), oncekit-noclaim (the same
// without the claim) and oncekit (one transaction per message).
func BenchmarkConsumePG(b *testing.B) {
	n := consumeN() / 5
	for _, c := range []struct {
		name            string
		batch           int
		noClaim, queued bool
	}{
		{"oncekit-batch", consumeBatch, false, false},
		{"oncekit-noclaim", consumeBatch, true, false},
		{"oncekit-batch-queue", consumeBatch, false, true},
		{"oncekit-noclaim-queue", consumeBatch, true, true},
		{"oncekit", 1, false, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				rate, goCPU, pgCPU := consumePGRun(b, n, c.batch, c.noClaim, c.queued)
				b.ReportMetric(rate, "msgs/s")
				b.ReportMetric(float64(goCPU.Microseconds())/float64(n), "go-cpu-µs/msg")
				if pgCPU > 0 {
					b.ReportMetric(float64(pgCPU.Microseconds())/float64(n), "pg-µs/msg")
				}
			}
		})
	}
}

// consumePGRun returns the rate, this process's CPU and the backend's CPU
// (0 when not measured) during the run.
func consumePGRun(b *testing.B, n, batch int, noClaim, queued bool) (rate float64, goCPU, pgCPU time.Duration) {
	ctx := context.Background()
	db := testenv.NewDB(b)
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE bench_effects (message_id uuid NOT NULL, payload bytea NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	var pid int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		b.Fatal(err)
	}
	src := &memSource{}
	payload := []byte(`{"amount":1250,"currency":"EUR","account":"acc-000123"}`)
	for range n {
		src.ds = append(src.ds, &memDelivery{id: uuid.NewString(), data: payload})
	}
	c, err := inbox.NewConsumer(pool, src, effectHandler(queued), &inbox.Config{
		Name: "bench", Schema: db.Schema, Concurrency: 1, BatchSize: batch, Test: inbox.TestConfig{DisableClaim: noClaim},
		Retention: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	cpu0 := procCPU(pid)
	go0 := processCPU()
	b.StartTimer()
	start := time.Now()
	go func() { done <- c.Run(rctx) }()
	for c.Stats().Processed < int64(n) {
		select {
		case err := <-done:
			b.Fatalf("consumer stopped: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cpu1 := procCPU(pid)
	go1 := processCPU()
	cancel()
	<-done
	if cpu0 < 0 || cpu1 < 0 {
		return float64(n) / elapsed.Seconds(), go1 - go0, 0
	}
	return float64(n) / elapsed.Seconds(), go1 - go0, cpu1 - cpu0
}

// procCPU is the user+system CPU of a local process, or -1.
func procCPU(pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // fields from 3 on
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond // USER_HZ = 100
}

// memSource is an broker.Source over a slice: every message once, acks ignored.
type memSource struct {
	mu sync.Mutex
	ds []broker.Delivery
}

func (s *memSource) Receive(ctx context.Context, max int) ([]broker.Delivery, error) {
	s.mu.Lock()
	if len(s.ds) == 0 {
		s.mu.Unlock()
		<-ctx.Done()
		return nil, ctx.Err()
	}
	k := min(max, len(s.ds))
	out := s.ds[:k]
	s.ds = s.ds[k:]
	s.mu.Unlock()
	return out, nil
}

func (s *memSource) Limits(context.Context) (broker.SourceLimits, error) {
	return broker.SourceLimits{AckWait: time.Minute, MaxDeliver: -1}, nil
}

type memDelivery struct {
	id   string
	data []byte
}

func (d *memDelivery) Subject() string { return "bench" }
func (d *memDelivery) Data() []byte    { return d.data }
func (d *memDelivery) Header(name string) string {
	if name == broker.HeaderMsgID {
		return d.id
	}
	return ""
}
func (d *memDelivery) Headers() map[string][]string {
	return map[string][]string{broker.HeaderMsgID: {d.id}}
}
func (d *memDelivery) Attempt() int                             { return 1 }
func (d *memDelivery) Ack(context.Context) error                { return nil }
func (d *memDelivery) Nak(context.Context, time.Duration) error { return nil }
func (d *memDelivery) InProgress(context.Context) error         { return nil }
