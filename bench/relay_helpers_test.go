package bench

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// relayEnvInt reads a scaling knob from the environment.
func relayEnvInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// relayEvents returns n events of 256 random bytes over n/10 keys,
// interleaved (event i of every key, then event i+1).
func relayEvents(subject string, n int) []broker.Message {
	keys := max(n/10, 1)
	out := make([]broker.Message, n)
	for i := range out {
		p := make([]byte, 256)
		_, _ = rand.Read(p)
		out[i] = broker.Message{ID: uuid.New(), Subject: subject, Key: fmt.Sprintf("key-%d", i%keys), Payload: p}
	}
	return out
}

// relayWorld is one measurement's fresh schema, stream and pool.
type relayWorld struct {
	db      *testenv.DB
	pool    *pgxpool.Pool
	nats    *testenv.NATS
	stream  jetstream.Stream
	subject string
	app     string        // application_name of pool's connections
	cpu     time.Duration // this process's CPU time during the last drain
	pgCPU   time.Duration // pool's PostgreSQL backends' CPU time during the last drain (0: not measured)

	bareRate float64 // msgs/s of the bare JetStream drain paired with this one (0: none)
}

// relayBackendCPU is the CPU time the PostgreSQL backends of w.pool have used
// so far, from /proc; ok is false when PostgreSQL is not local.
func (w *relayWorld) relayBackendCPU() (cpu time.Duration, ok bool) {
	return backendCPU(context.Background(), w.pool, w.app)
}

func newRelayWorld(b *testing.B) *relayWorld {
	b.Helper()
	return newRelayWorldOn(b, testenv.NewDB(b))
}

// newRelayWorldOn is newRelayWorld on the tables of db, which may already
// hold rows: a stream and a pool of its own.
func newRelayWorldOn(b *testing.B, db *testenv.DB) *relayWorld {
	b.Helper()
	w := &relayWorld{db: db, nats: testenv.NewNATS(b)}
	name := testenv.Name(b)
	w.subject = name + ".ev"
	var err error
	w.stream, err = natsjs.EnsureStream(context.Background(), w.nats.JS, natsjs.StreamConfig{Name: name, Subjects: []string{name + ".>"}})
	if err != nil {
		b.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(w.db.URL)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 24
	w.app = name
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	w.pool, err = pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(w.pool.Close)
	return w
}

// prefillOutbox enqueues msgs in transactions of 1000.
func (w *relayWorld) prefillOutbox(b *testing.B, ob *outbox.Outbox, msgs []broker.Message) {
	b.Helper()
	ctx := context.Background()
	for i := 0; i < len(msgs); i += 1000 {
		err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
			_, err := ob.Enqueue(ctx, tx, msgs[i:min(i+1000, len(msgs))]...)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// waitStream waits until the stream holds n messages.
func (w *relayWorld) waitStream(b *testing.B, n int, within time.Duration) {
	b.Helper()
	deadline := time.Now().Add(within)
	for {
		info, err := w.stream.Info(context.Background())
		if err == nil && info.State.Msgs >= uint64(n) {
			if info.State.Msgs > uint64(n) {
				b.Fatalf("stream holds %d messages, want %d", info.State.Msgs, n)
			}
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("stream did not reach %d messages within %v (err %v)", n, within, err)
		}
		time.Sleep(5 * time.Millisecond) // polling, with a deadline
	}
}

// waitLeases waits until live relays hold n partitions.
func (w *relayWorld) waitLeases(b *testing.B, n int, within time.Duration) {
	b.Helper()
	deadline := time.Now().Add(within)
	for {
		var held int
		err := w.pool.QueryRow(context.Background(),
			`SELECT count(*) FROM relay_partitions WHERE owner IS NOT NULL AND expires_at > now()`).Scan(&held)
		if err == nil && held >= n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("relays hold %d partitions, not %d, after %v (err %v)", held, n, within, err)
		}
		time.Sleep(5 * time.Millisecond) // polling, with a deadline
	}
}

// analyze refreshes the planner statistics of the world's tables after n
// rows were added, as autovacuum would have in a running system: it
// analyzes a table once its changes pass a tenth of the rows its statistics
// count (autovacuum_analyze_scale_factor), so a table of retained history
// keeps the statistics its fill left. (Analyzing a 10M-row outbox before
// every measurement sampled 30,000 of its pages each time and cancelled the
// autovacuum of the table that retention had started.)
func (w *relayWorld) analyze(b *testing.B, n int) {
	b.Helper()
	ctx := context.Background()
	rows, err := w.pool.Query(ctx, `SELECT quote_ident(c.relname) FROM pg_class c
		JOIN pg_namespace s ON s.oid = c.relnamespace
		WHERE s.nspname = $1 AND c.relkind = 'r' AND $2 > 0.1 * c.reltuples + 50`, w.db.Schema, n)
	if err != nil {
		b.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		b.Fatal(err)
	}
	for _, t := range tables {
		if _, err := w.pool.Exec(ctx, "ANALYZE "+t); err != nil {
			b.Fatal(err)
		}
	}
}
