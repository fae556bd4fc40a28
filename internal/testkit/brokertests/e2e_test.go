package brokertests_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/crashpoint"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// The end-to-end test runs the relay and the consumer in processes of their
// own (this test binary, re-executed) and SIGKILLs them at crash points.
const (
	helperEnv  = "WMBROKER_HELPER" // "relay" or "consumer"
	kindEnv    = "WMBROKER_KIND"
	addrEnv    = "WMBROKER_ADDR"
	destEnv    = "WMBROKER_DEST"
	dbEnv      = "WMBROKER_DB_URL"
	schemaEnv  = "WMBROKER_SCHEMA"
	relayCrash = "relay.after-publish"
)

var quiet = slog.New(slog.DiscardHandler)

// insertEffect is the consumer's handler: one effects row per processing.
func insertEffect(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (message_id) VALUES ($1)`, msg.ID)
	return err
}

func newRelay(pool *pgxpool.Pool, pub broker.Publisher, schema string) (*outbox.Relay, error) {
	ob, err := outbox.New(&outbox.Config{Schema: schema})
	if err != nil {
		return nil, err
	}
	return outbox.NewRelay(pool, ob, pub, &outbox.RelayConfig{Lease: 2 * time.Second, PollInterval: 100 * time.Millisecond,
		PublishTimeout: 5 * time.Second, Logger: quiet})
}

func consumerConfig(schema string) *inbox.Config {
	return &inbox.Config{Name: "c", Schema: schema, Concurrency: 1, BatchSize: 10, Logger: quiet}
}

// TestHelperProcess is not a test: it is the relay or consumer process the
// crash test starts and kills.
func TestHelperProcess(t *testing.T) {
	role := os.Getenv(helperEnv)
	if role == "" {
		t.Skip("helper process only")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(dbEnv))
	if err != nil {
		t.Fatal(err)
	}
	kind, addr, schema := os.Getenv(kindEnv), os.Getenv(addrEnv), os.Getenv(schemaEnv)
	switch role {
	case "relay":
		pub, _, err := newPublisher(kind, addr)
		if err != nil {
			t.Fatal(err)
		}
		r, err := newRelay(pool, pub, schema)
		if err != nil {
			t.Fatal(err)
		}
		_ = r.Run(ctx) // until killed
	case "consumer":
		src, _, err := newSource(kind, addr, os.Getenv(destEnv), nil)
		if err != nil {
			t.Fatal(err)
		}
		c, err := inbox.NewConsumer(pool, src, inbox.HandlerFunc(insertEffect), consumerConfig(schema))
		if err != nil {
			t.Fatal(err)
		}
		_ = c.Run(ctx) // until killed
	}
	t.Fatal("the helper was not killed")
}

// runKilled runs a helper process armed with a crash point and requires it
// to die of SIGKILL.
func runKilled(t *testing.T, env []string, role, point string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(append(os.Environ(), env...), helperEnv+"="+role, crashpoint.EnvVar+"="+point)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), "the %s must die: %v\n%s", role, err, out)
	ws, ok := ee.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "the %s was killed by SIGKILL: %v\n%s", role, err, out)
}

// e2eCrash: outbox → relay → broker → inbox with a relay process killed
// between publish and mark, then a consumer process killed between its
// commit and its ack. A relay and a consumer started afterwards settle
// everything: each event's effect happens once, the re-published copies and
// the unacked one coming back as duplicates for the inbox's claim, since
// the broker does not dedup by ID.
func e2eCrash(t *testing.T, kind, addr, dest string, inBroker func() int) {
	db := testenv.NewDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE effects (message_id uuid NOT NULL)`)
	require.NoError(t, err)
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	const n = 60
	want := make([]uuid.UUID, n)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	for i := range want {
		want[i] = uuid.New()
		_, err := ob.Enqueue(ctx, tx, broker.Message{ID: want[i], Subject: dest, Key: fmt.Sprintf("k%d", i%6), Payload: []byte(`{}`)})
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit(ctx))
	env := []string{kindEnv + "=" + kind, addrEnv + "=" + addr, destEnv + "=" + dest, dbEnv + "=" + db.URL, schemaEnv + "=" + db.Schema}

	// 1. The relay publishes a batch and dies before marking it.
	runKilled(t, env, "relay", relayCrash)
	published := inBroker()
	require.Positive(t, published, "the batch reached the broker")
	bl, err := ob.Backlog(ctx, db.Pool)
	require.NoError(t, err)
	require.EqualValues(t, n, bl.Pending, "nothing was marked published")

	// 2. A consumer commits its first message and dies before acking it.
	runKilled(t, env, "consumer", crashpoint.InboxAfterCommit)
	effects := func() (total, distinct int) {
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id) FROM effects`).Scan(&total, &distinct))
		return total, distinct
	}
	committed, _ := effects()
	require.Positive(t, committed, "the consumer committed before it was killed")

	// 3. A new relay re-publishes the unmarked batch with the rest; a new
	// consumer gets the unacked message again and both copies of the batch.
	pub, closePub, err := newPublisher(kind, addr)
	require.NoError(t, err)
	defer closePub()
	relay, err := newRelay(db.Pool, pub, db.Schema)
	require.NoError(t, err)
	src, closeSrc, err := newSource(kind, addr, dest, nil)
	require.NoError(t, err)
	defer closeSrc()
	c, err := inbox.NewConsumer(db.Pool, src, inbox.HandlerFunc(insertEffect), consumerConfig(db.Schema))
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 2)
	go func() { done <- relay.Run(rctx) }()
	go func() { done <- c.Run(rctx) }()
	defer func() { cancel(); <-done; <-done }()

	// Every delivery settles: the batch published before the crash (none
	// of it acked), then all n events re-published.
	require.Eventually(t, func() bool {
		s := c.Stats()
		return s.Processed+s.Duplicates == int64(published+n)
	}, time.Minute, 20*time.Millisecond)
	require.Eventually(t, func() bool {
		bl, err := ob.Backlog(ctx, db.Pool)
		return err == nil && bl.Pending == 0
	}, 30*time.Second, 20*time.Millisecond)
	total, distinct := effects()
	require.Equal(t, n, distinct, "every event has its effect")
	require.Equal(t, n, total, "once")
	s := c.Stats()
	require.EqualValues(t, n-committed, s.Processed)
	require.EqualValues(t, published+committed, s.Duplicates,
		"duplicates: the re-published copy of each message published before the crash, and both copies of the one committed before the kill")
}

func TestEndToEndCrashRabbitMQ(t *testing.T) {
	t.Parallel()
	uri := testenv.RabbitMQURL(t)
	queue := newQueue(t, uri, nil)
	e2eCrash(t, "rabbitmq", uri, queue, func() int {
		n, err := queueLen(uri, queue)
		require.NoError(t, err)
		return n
	})
}

func TestEndToEndCrashRedisStreams(t *testing.T) {
	t.Parallel()
	addr := testenv.RedisAddr(t)
	stream, client := newStream(t, addr)
	e2eCrash(t, "redis", addr, stream, func() int {
		n, err := client.XLen(context.Background(), stream).Result()
		require.NoError(t, err)
		return int(n)
	})
}
