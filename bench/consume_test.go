package bench

import (
	"context"
	"crypto/ed25519"
	crand "crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/eventsig"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// consumeN is the number of messages each BenchmarkConsume run consumes:
// ONCEKIT_BENCH_N, default 100,000.
func consumeN() int { return envInt("ONCEKIT_BENCH_N", 100_000) }

// Every contender runs consumeConcurrency workers (ONCEKIT_BENCH_CONCURRENCY,
// default 4); the batch consumers process consumeBatch messages per
// transaction (ONCEKIT_BENCH_BATCH, default 200: the BatchSize inbox.Config
// recommends for handlers that only write to PostgreSQL).
var (
	consumeConcurrency = envInt("ONCEKIT_BENCH_CONCURRENCY", 4)
	consumeBatch       = envInt("ONCEKIT_BENCH_BATCH", 200)
)

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// BenchmarkConsume consumes N pre-published JetStream messages into
// PostgreSQL, each handler inserting one business row, and reports msgs/s.
// One iteration is one whole run (use -benchtime 1x):
//
//   - oncekit-batch: inbox.Consumer, BatchSize 200 (one transaction per
//     batch, one claim statement per batch, savepoints only after a
//     failure); the handler inserts with tx.Exec, a round trip each
//   - oncekit-batch-queue: the same, the handler queuing its insert with
//     inbox.Queue (sent with the batch's commit, no round trip of its own)
//   - oncekit: inbox.Consumer, one transaction per message
//   - watermill: watermill router + watermill-nats JetStream subscribers on
//     the same durable, each message in its own pgx transaction doing the
//     same claim and insert (what a careful watermill user writes)
//   - oncekit-noclaim, oncekit-noclaim-queue: oncekit-batch and
//     oncekit-batch-queue with Config.Test.DisableClaim, to price the dedup claim
//
// The two batch contenders also report, per iteration, x-watermill and
// claim-overhead: their rate against a watermill run made just before it,
// and their two runs' rates (the timed one and an untimed one after it)
// against two runs of their noclaim twin, one before and one after (twin,
// contender, contender, twin), every run on a fresh schema and stream of
// its own. The ratios thus compare runs minutes apart at most, not a whole
// benchmark apart on a machine whose speed drifts, and the claim's pairs
// cancel a steady drift within the iteration.
func BenchmarkConsume(b *testing.B) {
	oncekit := func(batch int, noClaim, queued bool) func(*testing.B, *consumeEnv) {
		return func(b *testing.B, env *consumeEnv) { env.runOncekit(b, batch, noClaim, queued) }
	}
	watermill := func(b *testing.B, env *consumeEnv) { env.runWatermill(b) }
	for _, c := range []struct {
		name string
		run  func(b *testing.B, env *consumeEnv)
		twin func(b *testing.B, env *consumeEnv) // the noclaim twin of a paired contender, else nil
	}{
		{"oncekit-batch", oncekit(consumeBatch, false, false), oncekit(consumeBatch, true, false)},
		{"oncekit-batch-queue", oncekit(consumeBatch, false, true), oncekit(consumeBatch, true, true)},
		{"oncekit", oncekit(1, false, false), nil},
		{"watermill", watermill, nil},
		{"oncekit-noclaim", oncekit(consumeBatch, true, false), nil},
		{"oncekit-noclaim-queue", oncekit(consumeBatch, true, true), nil},
		// oncekit-batch with inbox.Config.Verifier: the Ed25519 check of
		// every message before its claim (eventsig).
		{"oncekit-batch-signed", func(b *testing.B, env *consumeEnv) {
			env.runOncekitVerified(b, consumeBatch, false, false, true)
		}, nil},
	} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				var wmRate, twinRates float64
				if c.twin != nil {
					wmRate = untimedConsume(b, watermill)
					twinRates = untimedConsume(b, c.twin)
				}
				env := newConsumeEnv(b, consumeN())
				pg0, pgOK := backendCPU(context.Background(), env.db.Pool, env.app)
				cpu0 := processCPU()
				b.StartTimer()
				start := time.Now()
				c.run(b, env)
				elapsed := time.Since(start)

				b.StopTimer()
				cpu1 := processCPU()
				pg1, pgOK1 := backendCPU(context.Background(), env.db.Pool, env.app)
				env.check(b)
				env.close()
				rate := float64(env.n) / elapsed.Seconds()
				b.ReportMetric(rate, "msgs/s")
				if c.twin != nil {
					b.ReportMetric(rate/wmRate, "x-watermill")
					// Twin, contender, contender again, twin again: the
					// order cancels a machine that speeds up or slows
					// down steadily through the pair.
					again := untimedConsume(b, c.run)
					twinRates += untimedConsume(b, c.twin)
					b.ReportMetric(1-(rate+again)/twinRates, "claim-overhead")
				}
				// CPU per message, which other load on a shared machine
				// disturbs far less than the rate: this process (the
				// consumer and the in-process NATS server) and PostgreSQL.
				b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(env.n), "go-cpu-µs/msg")
				if pgOK && pgOK1 {
					b.ReportMetric(float64((pg1-pg0).Microseconds())/float64(env.n), "pg-cpu-µs/msg")
				}
			}
		})
	}
}

// untimedConsume runs one contender on a fresh environment with the
// benchmark timer stopped, checks its effects, and returns its msgs/s.
func untimedConsume(b *testing.B, run func(b *testing.B, env *consumeEnv)) float64 {
	b.Helper()
	env := newConsumeEnv(b, consumeN())
	start := time.Now()
	run(b, env)
	elapsed := time.Since(start)
	env.check(b)
	env.close()
	return float64(env.n) / elapsed.Seconds()
}

// consumeEnv is one run's fresh schema and stream with N messages in it.
type consumeEnv struct {
	n      int
	db     *testenv.DB
	pool   *pgxpool.Pool // the contender's pool, its connections named app
	app    string
	nats   *testenv.NATS
	stream string
	ownDB  bool // db was made for this run: close drops it
	// retention is the consumer's Config.Retention (0: its default); a
	// run on tables filled with old claims sets -1, so that the consumer's
	// own retention does not delete them while it is timed.
	retention time.Duration
	// verifier checks the Ed25519 signature every message is published
	// with: the signed contender sets it as Config.Verifier.
	verifier *eventsig.Verifier
}

func newConsumeEnv(b *testing.B, n int) *consumeEnv {
	b.Helper()
	return newKeyedConsumeEnv(b, n, 0)
}

// newKeyedConsumeEnv is newConsumeEnv with each message given one of keys
// ordering keys at random (none when keys is 0).
func newKeyedConsumeEnv(b *testing.B, n, keys int) *consumeEnv {
	b.Helper()
	env := newConsumeEnvOn(b, testenv.NewDB(b), n, keys)
	env.ownDB = true
	return env
}

// newConsumeEnvOn is newKeyedConsumeEnv on the tables of db, which may
// already hold claims (an empty bench_effects is made for the run): a stream
// and a pool of its own. close leaves db as it is.
func newConsumeEnvOn(b *testing.B, db *testenv.DB, n, keys int) *consumeEnv {
	b.Helper()
	ctx := context.Background()
	env := &consumeEnv{n: n, db: db, nats: testenv.NewNATS(b), stream: "consume_" + uuid.NewString()[:8]}
	env.app = "oncekit_consume_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	cfg, err := pgxpool.ParseConfig(env.db.URL)
	if err != nil {
		b.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = env.app
	cfg.MaxConns = env.db.Pool.Config().MaxConns
	// Every contender's handler binds a uuid.UUID: encode it directly, as
	// the oncekit consumer does on its own.
	cfg.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
		inbox.RegisterUUID(conn.TypeMap())
		return nil
	}
	if env.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(env.pool.Close)
	if _, err := env.db.Pool.Exec(ctx, `DROP TABLE IF EXISTS bench_effects;
		CREATE TABLE bench_effects (message_id uuid NOT NULL, payload bytea NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	if _, err := natsjs.EnsureStream(ctx, env.nats.JS, natsjs.StreamConfig{Name: env.stream, Subjects: []string{env.stream}}); err != nil {
		b.Fatal(err)
	}
	pub, err := natsjs.NewPublisher(env.nats.Conn, nil)
	if err != nil {
		b.Fatal(err)
	}
	payload := []byte(`{"amount":1250,"currency":"EUR","account":"acc-000123"}`)
	// Every message is signed, for every contender: the signed one pays
	// for verifying, the others carry the same headers unread.
	public, private, _ := ed25519.GenerateKey(crand.Reader)
	signer, err := eventsig.NewSigner("bench", private)
	if err != nil {
		b.Fatal(err)
	}
	if env.verifier, err = eventsig.NewVerifier(map[string]ed25519.PublicKey{"bench": public}); err != nil {
		b.Fatal(err)
	}
	for off := 0; off < n; off += 1000 {
		msgs := make([]broker.Message, min(1000, n-off))
		for i := range msgs {
			msgs[i] = broker.Message{ID: uuid.New(), Subject: env.stream, Payload: payload}
			if keys > 0 {
				msgs[i].Key = "acc-" + strconv.Itoa(rand.IntN(keys))
			}
			msgs[i] = signer.Sign(msgs[i])
		}
		for _, r := range pub.Publish(ctx, msgs) {
			if r.Err != nil {
				b.Fatal(r.Err)
			}
		}
	}
	return env
}

// close releases the run's world (its pool, schema and NATS server) at
// once, so that the next run, timed or not, does not share the machine with
// an idle server and tables it no longer uses.
func (env *consumeEnv) close() {
	env.pool.Close()
	if env.ownDB {
		env.db.Close()
	}
	env.nats.Close()
}

func (env *consumeEnv) check(b *testing.B) {
	b.Helper()
	var rows int
	if err := env.db.Pool.QueryRow(context.Background(), `SELECT count(DISTINCT message_id) FROM bench_effects`).Scan(&rows); err != nil {
		b.Fatal(err)
	}
	if rows != env.n {
		b.Fatalf("%d distinct effects, want %d", rows, env.n)
	}
}

const insertEffect = `INSERT INTO bench_effects (message_id, payload) VALUES ($1, $2)`

// effectHandler inserts the message's business row: with tx.Exec, or
// queued with inbox.Queue (sent with the batch's next statement).
func effectHandler(queued bool) inbox.Handler {
	if queued {
		return inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
			return inbox.Queue(ctx, tx, insertEffect, msg.ID, msg.Payload)
		})
	}
	return inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		_, err := tx.Exec(ctx, insertEffect, msg.ID, msg.Payload)
		return err
	})
}

func (env *consumeEnv) runOncekit(b *testing.B, batch int, noClaim, queued bool) {
	env.runOncekitVerified(b, batch, noClaim, queued, false)
}

// runOncekitVerified is runOncekit, verifying each message's signature
// before its claim when verify is set.
func (env *consumeEnv) runOncekitVerified(b *testing.B, batch int, noClaim, queued, verify bool) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src, err := natsjs.NewSource(ctx, env.nats.JS, &natsjs.SourceConfig{Stream: env.stream, Durable: "oncekit"})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	cfg := &inbox.Config{
		Name: "bench", Schema: env.db.Schema, Concurrency: consumeConcurrency, BatchSize: batch,
		Test: inbox.TestConfig{DisableClaim: noClaim}, Retention: env.retention, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if verify {
		cfg.Verifier = env.verifier
	}
	c, err := inbox.NewConsumer(env.pool, src, effectHandler(queued), cfg)
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	watch := stallWatch{env: env, durable: "oncekit"}
	for p := c.Stats().Processed; p < int64(env.n); p = c.Stats().Processed {
		watch.progress(b, p, c.Stats())
		select {
		case err := <-done:
			b.Fatalf("consumer stopped: %v", err)
		case <-time.After(2 * time.Millisecond):
		}
	}
	cancel()
	<-done
}

// stallWatch logs, once, what the durable and the consumer hold when a run
// has made no progress for stallAfter: the queued modes once stalled for
// about 30 s (the pull's expiry, and AckWait), and a stall seen again
// should say whether JetStream held the messages (NumPending), waited for
// acks (NumAckPending at MaxAckPending) or had no pull request waiting
// (NumWaiting 0: the client believed one was).
type stallWatch struct {
	env      *consumeEnv
	durable  string
	last     int64
	since    time.Time
	reported bool
}

const stallAfter = 5 * time.Second

func (w *stallWatch) progress(b *testing.B, processed int64, stats inbox.Stats) {
	if processed != w.last || w.since.IsZero() {
		w.last, w.since = processed, time.Now()
		return
	}
	if w.reported || time.Since(w.since) < stallAfter {
		return
	}
	w.reported = true
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := w.env.nats.JS.Consumer(ctx, w.env.stream, w.durable)
	if err != nil {
		b.Logf("no progress for %v at %d processed; consumer info: %v", stallAfter, processed, err)
		return
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		b.Logf("no progress for %v at %d processed; consumer info: %v", stallAfter, processed, err)
		return
	}
	b.Logf("no progress for %v at %d processed: stats %+v; durable: pending %d, waiting pulls %d, ack pending %d (max %d), redelivered %d, delivered %d, ack floor %d",
		stallAfter, processed, stats, ci.NumPending, ci.NumWaiting, ci.NumAckPending, ci.Config.MaxAckPending, ci.NumRedelivered,
		ci.Delivered.Consumer, ci.AckFloor.Consumer)
}

func (env *consumeEnv) runWatermill(b *testing.B) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logger := watermill.NopLogger{}
	// The durable the subscribers share, like the oncekit source's.
	stream, err := env.nats.JS.Stream(ctx, env.stream)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Name: "watermill__bench__" + env.stream, Durable: "watermill__bench__" + env.stream,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: 2048,
	}); err != nil {
		b.Fatal(err)
	}
	sub, err := wmjs.NewSubscriber(wmjs.SubscriberConfig{
		Conn: env.nats.Conn, Logger: logger, AckAsync: true,
		ResourceInitializer: wmjs.ExistingConsumer(nil, "bench"),
	})
	if err != nil {
		b.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		b.Fatal(err)
	}
	var processed atomic.Int64
	claim := fmt.Sprintf(`INSERT INTO %q.processed_messages (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, env.db.Schema)
	handler := func(msg *message.Message) error {
		ctx := msg.Context()
		id, err := uuid.Parse(msg.Metadata.Get(broker.HeaderEventID))
		if err != nil {
			return nil // a careful user would dead-letter it; none here
		}
		tx, err := env.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		tag, err := tx.Exec(ctx, claim, "bench", id)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return nil // duplicate
		}
		if _, err := tx.Exec(ctx, insertEffect, id, msg.Payload); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		processed.Add(1)
		return nil
	}
	for i := range consumeConcurrency {
		router.AddNoPublisherHandler(fmt.Sprintf("bench-%d", i), env.stream, sub, handler)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := router.Run(ctx); err != nil {
			b.Error(err)
		}
	}()
	for processed.Load() < int64(env.n) {
		time.Sleep(2 * time.Millisecond) // polling, inside the measurement
	}
	cancel()
	wg.Wait()
}
