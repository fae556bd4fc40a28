package inbox_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/crashpoint"
)

const helperEnv = "INBOX_TEST_HELPER"

// TestHelperProcess is not a test: it is the consumer process the crash
// tests start (and kill) by re-executing the test binary.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "consumer" {
		t.Skip("helper process only")
	}
	pool, src := helperSource(t, time.Second)
	batch, _ := strconv.Atoi(os.Getenv("INBOX_BATCH"))
	c, err := inbox.NewConsumer(pool, src, inbox.HandlerFunc(insertEffect), &inbox.Config{
		Name: "c", Schema: os.Getenv("INBOX_SCHEMA"), BatchSize: batch, Concurrency: 1, Logger: testLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Run(context.Background()) // until killed
}

// helperCmd is the command that re-executes the test binary as the helper
// process test (its helperEnv set to role), on this test's database and
// stream, with env added.
func (b *bundle) helperCmd(ctx context.Context, test, role string, env ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+test+"$")
	cmd.Env = append(os.Environ(),
		helperEnv+"="+role,
		"INBOX_DB_URL="+b.db.URL,
		"INBOX_SCHEMA="+b.db.Schema,
		"INBOX_NATS_URL="+b.nats.URL,
		"INBOX_STREAM="+b.stream,
	)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	return cmd
}

// helperSource connects a helper process to the test's database and to its
// stream's durable "d", as the environment describes them.
func helperSource(t *testing.T, ackWait time.Duration) (*pgxpool.Pool, *natsjs.Source) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("INBOX_DB_URL"))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(os.Getenv("INBOX_NATS_URL"))
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	src, err := natsjs.NewSource(ctx, js, &natsjs.SourceConfig{
		Stream: os.Getenv("INBOX_STREAM"), Durable: "d", AckWait: ackWait,
	})
	if err != nil {
		t.Fatal(err)
	}
	return pool, src
}

// A consumer process is SIGKILLed around the commit; a restarted consumer
// settles every message and each effect exists once.
func TestCrashedConsumerEffectsOnce(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts subprocesses")
	}
	for _, tc := range []struct {
		name  string
		point string
		batch int
	}{
		{"single/after-commit", crashpoint.InboxAfterCommit, 1},
		{"single/before-commit", crashpoint.InboxBeforeCommit, 1},
		{"batch/after-commit", crashpoint.InboxAfterCommit, 5},
		{"batch/before-commit", crashpoint.InboxBeforeCommit, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			msgs := make([]broker.Message, 5)
			for i := range msgs {
				msgs[i] = b.msg("", i)
			}
			b.publish(msgs...)

			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := b.helperCmd(ctx, "TestHelperProcess", "consumer",
				"INBOX_BATCH="+strconv.Itoa(tc.batch), crashpoint.EnvVar+"="+tc.point)
			err := cmd.Run()
			var ee *exec.ExitError
			require.True(t, errors.As(err, &ee), "the helper must die: %v", err)
			ws, ok := ee.Sys().(syscall.WaitStatus)
			require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "killed by SIGKILL: %v", err)

			committed := len(b.effects())
			if tc.point == crashpoint.InboxAfterCommit {
				require.Positive(t, committed, "the transaction committed before the kill")
			} else {
				require.Zero(t, committed, "nothing committed before the kill")
			}
			require.Equal(t, committed, b.count(`SELECT count(*) FROM processed_messages`))

			// The restarted consumer gets the unacked messages after the ack wait.
			c := b.start(b.source("d", time.Second), inbox.HandlerFunc(insertEffect), b.config("c"))
			waitStats(t, c, func(s inbox.Stats) bool { return s.Processed+s.Duplicates == int64(len(msgs)) })
			require.EqualValues(t, committed, c.Stats().Duplicates, "what committed before the kill comes back as duplicates")
			eff := b.effects()
			require.Len(t, eff, len(msgs))
			for _, m := range msgs {
				require.Equal(t, 1, eff[m.ID], "effect once")
			}
		})
	}
}

// The backend dies between the handler and COMMIT: the commit's outcome is
// unknown to the consumer, so it neither acks nor naks; JetStream redelivers
// after the ack wait (not after the short backoff a nak would ask for) and
// the message is processed once.
func TestCommitWithUnknownOutcomeIsNotSettled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	var calls []time.Time
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		mu.Lock()
		calls = append(calls, time.Now())
		first := len(calls) == 1
		mu.Unlock()
		if err := insertEffect(ctx, tx, msg); err != nil {
			return err
		}
		if first {
			var pid int
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			if _, err := b.db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1, 10000)`, pid); err != nil {
				return err
			}
		}
		return nil
	})
	cfg := b.config("c")
	cfg.MinBackoff, cfg.MaxBackoff = 10*time.Millisecond, 10*time.Millisecond
	const ackWait = 2 * time.Second
	c := b.start(b.source("d", ackWait), h, cfg)
	m := b.msg("", 1)
	b.publish(m)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == 1 })
	require.Equal(t, inbox.Stats{Processed: 1}, c.Stats(), "neither a retry nor a duplicate: the first outcome was left open")
	require.Equal(t, map[uuid.UUID]int{m.ID: 1}, b.effects())
	require.Equal(t, 2, b.count(`SELECT attempt FROM effects`))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, calls, 2)
	// The ack wait runs from the delivery, before the first call: on a
	// loaded machine the two calls are less than ackWait apart, and a nak
	// would have brought the message back within milliseconds.
	require.GreaterOrEqual(t, calls[1].Sub(calls[0]), ackWait/2, "redelivered by the ack wait, not by a nak")
}
