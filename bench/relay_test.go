package bench

import (
	"context"
	"database/sql"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// BenchmarkRelay drains ONCEKIT_BENCH_N (default 100,000) pre-filled 256-byte
// events from PostgreSQL into JetStream: oncekit's relay, watermill-sql's
// Forwarder (same JetStream, TrackMsgId), and bare async JetStream publishing
// with Nats-Msg-Id as the ceiling. One iteration is one whole drain.
//
// oncekit also reports x-jetstream: its rate over a bare JetStream drain of
// the same events run just before it in the same iteration (untimed), so
// that the ratio compares the two on the machine as it is at that moment,
// not minutes apart on a machine whose speed drifts. oncekit-logical does
// the same with the events written into the WAL (outbox.Config.Logical) and
// the LogicalRelay, on BenchmarkLatencyE2E's wal_level=logical cluster.
func BenchmarkRelay(b *testing.B) {
	n := relayEnvInt("ONCEKIT_BENCH_N", 100_000)
	b.Run("oncekit", func(b *testing.B) { relayDrain(b, n, pairedWithJetStream(n, drainOncekit)) })
	b.Run("oncekit-logical", func(b *testing.B) {
		relayDrainOn(b, n, newLogicalRelayWorld, pairedWithJetStream(n, drainLogical))
	})
	if os.Getenv("ONCEKIT_BENCH_DBONLY") != "" {
		b.Run("oncekit-dbonly", func(b *testing.B) { relayDrain(b, n, drainOncekitDBOnly) })
	}
	b.Run("watermill", func(b *testing.B) { relayDrain(b, n, drainWatermill) })
	b.Run("jetstream", func(b *testing.B) { relayDrain(b, n, drainJetStream) })
}

// pairedWithJetStream returns drain preceded, in each iteration, by an
// untimed bare JetStream drain of n events on a world of its own; drain's
// world records the bare rate for relayDrain's x-jetstream.
func pairedWithJetStream(n int, drain func(b *testing.B, w *relayWorld, msgs []broker.Message) time.Duration) func(b *testing.B, w *relayWorld, msgs []broker.Message) time.Duration {
	return func(b *testing.B, w *relayWorld, msgs []broker.Message) time.Duration {
		b.StopTimer()
		bw := newRelayWorld(b)
		bare := drainJetStream(b, bw, relayEvents(bw.subject+".x", n))
		b.StopTimer()
		w.bareRate = float64(n) / bare.Seconds()
		b.StartTimer()
		return drain(b, w, msgs)
	}
}

// relayDrain runs drain b.N times and reports msgs/s over the measured time.
func relayDrain(b *testing.B, n int, drain func(b *testing.B, w *relayWorld, msgs []broker.Message) time.Duration) {
	relayDrainOn(b, n, newRelayWorld, drain)
}

// relayDrainOn is relayDrain on worlds newWorld makes.
func relayDrainOn(b *testing.B, n int, newWorld func(*testing.B) *relayWorld, drain func(b *testing.B, w *relayWorld, msgs []broker.Message) time.Duration) {
	var total, cpu, pgCPU time.Duration
	var xBare float64
	for range b.N {
		b.StopTimer()
		w := newWorld(b)
		msgs := relayEvents(w.subject+".x", n)
		b.StartTimer()
		took := drain(b, w, msgs)
		total += took
		cpu += w.cpu
		pgCPU += w.pgCPU
		if w.bareRate > 0 {
			xBare += float64(n) / took.Seconds() / w.bareRate
		}
	}
	if xBare > 0 {
		b.ReportMetric(xBare/float64(b.N), "x-jetstream")
	}
	b.ReportMetric(float64(n*b.N)/total.Seconds(), "msgs/s")
	// CPU of this process (relay or publisher, NATS client and the
	// in-process nats-server) per message: unlike msgs/s it hardly moves
	// when other work shares the machine.
	b.ReportMetric(float64(cpu.Microseconds())/float64(n*b.N), "go-cpu-us/msg")
	if pgCPU > 0 {
		// CPU of the PostgreSQL backends serving the drain (fetch, mark).
		b.ReportMetric(float64(pgCPU.Microseconds())/float64(n*b.N), "pg-cpu-us/msg")
	}
}

// ackAll acknowledges without a broker: the database side's ceiling.
type ackAll struct{}

func (ackAll) Publish(_ context.Context, msgs []broker.Message) []broker.Result {
	out := make([]broker.Result, len(msgs))
	for i, m := range msgs {
		out[i].ID = m.ID
	}
	return out
}

func drainOncekitDBOnly(b *testing.B, w *relayWorld, msgs []broker.Message) time.Duration {
	return drainOncekitWith(b, w, msgs, ackAll{}, false)
}

func drainOncekit(b *testing.B, w *relayWorld, msgs []broker.Message) time.Duration {
	pub, err := natsjs.NewPublisher(w.nats.Conn, &natsjs.PublisherConfig{MaxPending: relayEnvInt("ONCEKIT_BENCH_PENDING", 4096)})
	if err != nil {
		b.Fatal(err)
	}
	return drainOncekitWith(b, w, msgs, pub, true)
}

func drainOncekitWith(b *testing.B, w *relayWorld, msgs []broker.Message, pub broker.Publisher, waitStream bool) time.Duration {
	b.StopTimer()
	ob, err := outbox.New(&outbox.Config{Schema: w.db.Schema})
	if err != nil {
		b.Fatal(err)
	}
	w.prefillOutbox(b, ob, msgs)
	w.analyze(b, len(msgs))
	relay, err := outbox.NewRelay(w.pool, ob, pub, &outbox.RelayConfig{
		Logger: relayBenchLogger(), Retention: -1,
		BatchSize: relayEnvInt("ONCEKIT_BENCH_BATCH", 1000),
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	b.StartTimer()
	pg0, pgOK := w.relayBackendCPU()
	start := time.Now()
	cpu0 := processCPU()
	go func() { done <- relay.Run(ctx) }()
	if waitStream {
		w.waitStream(b, len(msgs), 10*time.Minute)
	}
	// Drained means marked too.
	for {
		left, err := ob.Backlog(ctx, w.pool)
		if err != nil {
			b.Fatal(err)
		}
		if left.Pending == 0 {
			break
		}
		time.Sleep(2 * time.Millisecond) // polling the backlog, inside the measurement
	}
	elapsed := time.Since(start)
	w.cpu = processCPU() - cpu0
	b.StopTimer()
	if pg1, ok := w.relayBackendCPU(); ok && pgOK {
		w.pgCPU = pg1 - pg0
	}
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.StartTimer()
	return elapsed
}

// newLogicalRelayWorld is a relay world on e2eCluster (wal_level=logical).
func newLogicalRelayWorld(b *testing.B) *relayWorld {
	b.Helper()
	return newRelayWorldOn(b, testenv.NewDBOn(b, e2eURL(b)))
}

// drainLogical writes msgs into the WAL (after the slot) and times the
// LogicalRelay's drain of them into the stream; the PostgreSQL CPU counts
// the WAL sender, which decodes.
func drainLogical(b *testing.B, w *relayWorld, msgs []broker.Message) time.Duration {
	b.StopTimer()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ob, err := outbox.New(&outbox.Config{Schema: w.db.Schema, Logical: true})
	if err != nil {
		b.Fatal(err)
	}
	if err := ob.SetUpLogical(ctx, w.pool); err != nil {
		b.Fatal(err)
	}
	w.prefillOutbox(b, ob, msgs)
	pub, err := natsjs.NewPublisher(w.nats.Conn, &natsjs.PublisherConfig{MaxPending: relayEnvInt("ONCEKIT_BENCH_PENDING", 4096)})
	if err != nil {
		b.Fatal(err)
	}
	relay, err := outbox.NewLogicalRelay(w.pool, ob, pub, &outbox.LogicalRelayConfig{
		Logger: relayBenchLogger(), BatchSize: relayEnvInt("ONCEKIT_BENCH_BATCH", 1000),
		Table: outbox.RelayConfig{Retention: -1},
	})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	b.StartTimer()
	pg0, pgOK := w.relayBackendCPU()
	wal0, _ := backendCPU(ctx, w.pool, "oncekit-logical-relay")
	start := time.Now()
	cpu0 := processCPU()
	go func() { done <- relay.Run(ctx) }()
	w.waitStream(b, len(msgs), 10*time.Minute)
	elapsed := time.Since(start)
	w.cpu = processCPU() - cpu0
	b.StopTimer()
	wal1, _ := backendCPU(ctx, w.pool, "oncekit-logical-relay")
	if pg1, ok := w.relayBackendCPU(); ok && pgOK {
		w.pgCPU = pg1 - pg0 + wal1 - wal0
	}
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	dropSlot(w.db, "oncekit_"+w.db.Schema)
	b.StartTimer()
	return elapsed
}

func drainWatermill(b *testing.B, w *relayWorld, msgs []broker.Message) time.Duration {
	b.StopTimer()
	ctx := context.Background()
	db, err := sql.Open("pgx", w.db.URL)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	logger := watermill.NopLogger{}
	schema := wmsql.DefaultPostgreSQLSchema{}
	const fwdTopic = "oncekit_forwarder"
	sqlPub, err := wmsql.NewPublisher(db, wmsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, logger)
	if err != nil {
		b.Fatal(err)
	}
	fwdPub := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: fwdTopic})
	for i := 0; i < len(msgs); i += 1000 {
		var batch []*message.Message
		for _, m := range msgs[i:min(i+1000, len(msgs))] {
			wm := message.NewMessage(m.ID.String(), m.Payload)
			wm.Metadata.Set(broker.HeaderKey, m.Key)
			batch = append(batch, wm)
		}
		if err := fwdPub.Publish(msgs[0].Subject, batch...); err != nil {
			b.Fatal(err)
		}
	}
	w.analyze(b, len(msgs))
	sub, err := wmsql.NewSubscriber(db, wmsql.SubscriberConfig{
		SchemaAdapter: schema, OffsetsAdapter: wmsql.DefaultPostgreSQLOffsetsAdapter{}, InitializeSchema: true,
	}, logger)
	if err != nil {
		b.Fatal(err)
	}
	natsPub, err := wmnats.NewPublisher(wmnats.PublisherConfig{
		URL:       w.nats.URL,
		JetStream: wmnats.JetStreamConfig{TrackMsgId: true},
	}, logger)
	if err != nil {
		b.Fatal(err)
	}
	fwd, err := forwarder.NewForwarder(sub, natsPub, logger, forwarder.Config{ForwarderTopic: fwdTopic})
	if err != nil {
		b.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	b.StartTimer()
	start := time.Now()
	cpu0 := processCPU()
	go func() { done <- fwd.Run(rctx) }()
	w.waitStream(b, len(msgs), 30*time.Minute)
	elapsed := time.Since(start)
	w.cpu = processCPU() - cpu0
	b.StopTimer()
	cancel()
	_ = fwd.Close()
	<-done
	_ = natsPub.Close()
	b.StartTimer()
	return elapsed
}

func drainJetStream(b *testing.B, w *relayWorld, msgs []broker.Message) time.Duration {
	b.StopTimer()
	js, err := jetstream.New(w.nats.Conn, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	out := make([]*nats.Msg, len(msgs))
	for i, m := range msgs {
		out[i] = natsjs.NATSMsg(m)
	}
	var failed atomic.Int64
	b.StartTimer()
	start := time.Now()
	cpu0 := processCPU()
	futures := make([]jetstream.PubAckFuture, len(out))
	for i, m := range out {
		// Waits for room in a full window as natsjs.Publisher does (the
		// 200 ms default fails the run on a loaded machine).
		f, err := js.PublishMsgAsync(m, jetstream.WithMsgID(msgs[i].ID.String()), jetstream.WithStallWait(30*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		futures[i] = f
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case <-f.Err():
			failed.Add(1)
		}
	}
	elapsed := time.Since(start)
	w.cpu = processCPU() - cpu0
	if failed.Load() > 0 {
		b.Fatalf("%d publishes failed", failed.Load())
	}
	return elapsed
}

// BenchmarkRelayLatency measures commit → JetStream ack (the stream's store
// timestamp) at a steady ONCEKIT_BENCH_RATE events/s (default 1,000), each
// event its own transaction, for ONCEKIT_BENCH_SECONDS (default 10):
// "poll" is the default (adaptive polling, no NOTIFY), "notify" has writers
// NOTIFY and the relay LISTEN.
func BenchmarkRelayLatency(b *testing.B) {
	rate := relayEnvInt("ONCEKIT_BENCH_RATE", 1000)
	secs := relayEnvInt("ONCEKIT_BENCH_SECONDS", 10)
	b.Run("poll", func(b *testing.B) { relayLatency(b, rate, secs, false) })
	b.Run("notify", func(b *testing.B) { relayLatency(b, rate, secs, true) })
}

func relayLatency(b *testing.B, rate, secs int, notify bool) {
	var all []float64
	for range b.N {
		all = append(all, relayLatencyOnce(b, rate, secs, notify)...)
	}
	slices.Sort(all)
	if len(all) == 0 {
		b.Fatal("no samples")
	}
	pct := func(p float64) float64 { return all[min(int(p*float64(len(all))), len(all)-1)] }
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(all[len(all)-1], "max-ms")
}

func relayLatencyOnce(b *testing.B, rate, secs int, notify bool) []float64 {
	return relayLatencyOn(b, newRelayWorld(b), rate, secs, notify)
}

// relayLatencyOn runs a relay on w and commits rate events/s, one per
// transaction, for secs seconds, and returns each event's commit → JetStream
// store time in milliseconds (the first second left out as warm-up).
func relayLatencyOn(b *testing.B, w *relayWorld, rate, secs int, notify bool) []float64 {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ob, err := outbox.New(&outbox.Config{Schema: w.db.Schema, Notify: notify})
	if err != nil {
		b.Fatal(err)
	}
	pub, err := natsjs.NewPublisher(w.nats.Conn, nil)
	if err != nil {
		b.Fatal(err)
	}
	relay, err := outbox.NewRelay(w.pool, ob, pub, &outbox.RelayConfig{
		Logger: relayBenchLogger(), Retention: -1,
	})
	if err != nil {
		b.Fatal(err)
	}
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(ctx) }()
	cons, err := w.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		b.Fatal(err)
	}
	total := rate * secs
	type stored struct {
		id string
		at time.Time
	}
	storedCh := make(chan []stored, 1)
	go func() {
		var got []stored
		it, err := cons.Messages()
		if err != nil {
			b.Error(err)
			storedCh <- nil
			return
		}
		defer it.Stop()
		for len(got) < total {
			m, err := it.Next()
			if err != nil {
				break
			}
			meta, err := m.Metadata()
			if err != nil {
				continue
			}
			got = append(got, stored{id: m.Headers().Get(broker.HeaderMsgID), at: meta.Timestamp})
		}
		storedCh <- got
	}()
	// The clock starts once the relay holds its partitions.
	w.waitLeases(b, outbox.DefaultPartitions, 30*time.Second)

	var mu sync.Mutex
	committed := make(map[string]time.Time, total)
	const writers = 8
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	var wg sync.WaitGroup
	for wr := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := wr; j < total; j += writers {
				if d := time.Until(start.Add(time.Duration(j) * interval)); d > 0 {
					time.Sleep(d) // pacing the writers at rate, not a wait for state
				}
				m := relayEvents(w.subject+".x", 1)[0]
				err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
					_, err := ob.Enqueue(ctx, tx, m)
					return err
				})
				if err != nil {
					b.Error(err)
					return
				}
				now := time.Now()
				mu.Lock()
				committed[m.ID.String()] = now
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	var got []stored
	select {
	case got = <-storedCh:
	case <-time.After(60 * time.Second):
		b.Fatal("not every event arrived")
	}
	cancel()
	<-relayDone
	var lat []float64
	warm := start.Add(time.Second)
	for _, s := range got {
		c, ok := committed[s.id]
		if !ok || c.Before(warm) {
			continue
		}
		lat = append(lat, max(float64(s.at.Sub(c).Microseconds())/1000, 0))
	}
	return lat
}

// BenchmarkOutboxNotify measures what NOTIFY costs writers: 16 concurrent
// writers each committing one-event transactions for ONCEKIT_BENCH_SECONDS,
// with and without Config.Notify. Reports commits/s.
func BenchmarkOutboxNotify(b *testing.B) {
	secs := relayEnvInt("ONCEKIT_BENCH_SECONDS", 10)
	for _, notify := range []bool{false, true} {
		name := "without-notify"
		if notify {
			name = "with-notify"
		}
		b.Run(name, func(b *testing.B) {
			var commits int64
			var elapsed time.Duration
			for range b.N {
				b.StopTimer()
				w := newRelayWorld(b)
				ob, err := outbox.New(&outbox.Config{Schema: w.db.Schema, Notify: notify})
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				var n atomic.Int64
				ctx := context.Background()
				stop := time.Now().Add(time.Duration(secs) * time.Second)
				start := time.Now()
				var wg sync.WaitGroup
				for range 16 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for time.Now().Before(stop) {
							m := relayEvents(w.subject+".x", 1)[0]
							err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
								_, err := ob.Enqueue(ctx, tx, m)
								return err
							})
							if err != nil {
								b.Error(err)
								return
							}
							n.Add(1)
						}
					}()
				}
				wg.Wait()
				elapsed += time.Since(start)
				commits += n.Load()
			}
			b.ReportMetric(float64(commits)/elapsed.Seconds(), "commits/s")
		})
	}
}

func relayBenchLogger() *slog.Logger {
	if os.Getenv("ONCEKIT_BENCH_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
