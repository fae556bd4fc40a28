package bench

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/inbox"
)

// consumeKeys is the number of ordering keys of BenchmarkConsumeOrdered's
// messages (ONCEKIT_BENCH_KEYS, default 1000).
var consumeKeys = envInt("ONCEKIT_BENCH_KEYS", 1000)

// BenchmarkConsumeOrdered prices ordered mode's check against the messages
// other processes hold (inbox.Config.Ordered) on N pre-published messages
// spread over consumeKeys keys, BatchSize 200, each handler inserting one
// row. Each iteration runs, every run on a fresh schema and stream:
// without the check (Test.DisableOrderGate: order within one process only, as
// before the check existed), with it, with it again, without it again; it
// reports both rates (the means of their two runs) and gated/ungated, the
// ratio, which the paired order keeps from the machine's drift.
//
//   - ordered: one consumer process
//   - ordered-2proc: two consumers of one durable (each on its own NATS
//     connection, Concurrency halved), as two processes would be
//
// ordered-maxackpending1 prices the other way to keep order across
// crashes, a durable (or one per key partition) with MaxAckPending 1: it
// runs the ordered consumer with the check, then without it on such a
// durable (BatchSize 1: one message is in flight at a time), on N/10
// messages, and reports the second's rate and its ratio to the first.
func BenchmarkConsumeOrdered(b *testing.B) {
	b.Run("ordered-maxackpending1", func(b *testing.B) {
		b.StopTimer()
		for range b.N {
			gated := consumeOrderedRun(b, consumeN()/10, true, 1, 0)
			one := consumeOrderedRun(b, consumeN()/10, false, 1, 1)
			b.ReportMetric(one, "msgs/s")
			b.ReportMetric(one/gated, "x-gated")
		}
	})
	for _, c := range []struct {
		name  string
		procs int
	}{{"ordered", 1}, {"ordered-2proc", 2}} {
		b.Run(c.name, func(b *testing.B) {
			run := func(gate bool) float64 { return consumeOrderedRun(b, consumeN(), gate, c.procs, 0) }
			b.StopTimer()
			for range b.N {
				off := run(false)
				on := run(true)
				on += run(true)
				off += run(false)
				b.ReportMetric(on/2, "gated-msgs/s")
				b.ReportMetric(off/2, "ungated-msgs/s")
				b.ReportMetric(on/off, "gated/ungated")
			}
		})
	}
}

// consumeOrderedRun consumes n keyed messages on a fresh environment with
// procs ordered consumers of one durable and returns their msgs/s. A
// maxAckPending of 1 also makes the batches 1.
func consumeOrderedRun(b *testing.B, n int, gate bool, procs, maxAckPending int) float64 {
	b.Helper()
	env := newKeyedConsumeEnv(b, n, consumeKeys)
	start := time.Now()
	env.runOrdered(b, gate, procs, maxAckPending)
	elapsed := time.Since(start)
	env.check(b)
	env.close()
	return float64(env.n) / elapsed.Seconds()
}

// runOrdered consumes the environment's messages with procs ordered
// consumers of one durable.
func (env *consumeEnv) runOrdered(b *testing.B, gate bool, procs, maxAckPending int) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cs []*inbox.Consumer
	done := make(chan error, procs)
	for range procs {
		nc, err := nats.Connect(env.nats.URL)
		if err != nil {
			b.Fatal(err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			b.Fatal(err)
		}
		src, err := natsjs.NewSource(ctx, js, &natsjs.SourceConfig{Stream: env.stream, Durable: "oncekit", MaxAckPending: maxAckPending})
		if err != nil {
			b.Fatal(err)
		}
		defer src.Close()
		batch := consumeBatch
		if maxAckPending == 1 {
			batch = 1
		}
		c, err := inbox.NewConsumer(env.pool, src, effectHandler(false), &inbox.Config{
			Name: "bench", Schema: env.db.Schema, Concurrency: max(consumeConcurrency/procs, 1), BatchSize: batch,
			Ordered: true, Test: inbox.TestConfig{DisableOrderGate: !gate}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			b.Fatal(err)
		}
		cs = append(cs, c)
		go func() { done <- c.Run(ctx) }()
	}
	for {
		var n int64
		for _, c := range cs {
			n += c.Stats().Processed
		}
		if n >= int64(env.n) {
			break
		}
		select {
		case err := <-done:
			b.Fatalf("consumer stopped: %v", err)
		case <-time.After(2 * time.Millisecond):
		}
	}
	cancel()
	for range cs {
		<-done
	}
}
