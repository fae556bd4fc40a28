package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/examples/sqs/fauxqs"
	"github.com/oncekit/oncekit/internal/testkit/brokerkill"
	"github.com/oncekit/oncekit/oncekittest"
	"github.com/oncekit/oncekit/outbox"
)

// argsEnv, when set, makes the test binary run the command instead of the
// tests, with these arguments (separated by \x1f). A brokerkill role in the
// environment makes it a relay or consumer of the kill run instead.
const argsEnv = "ONCEKIT_SQS_EXAMPLE_ARGS"

func TestMain(m *testing.M) {
	if brokerkill.Role() != "" {
		if err := runKillHelper(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if args := os.Getenv(argsEnv); args != "" {
		os.Args = append(os.Args[:1], strings.Split(args, "\x1f")...)
		main()
		os.Exit(0)
	}
	code := m.Run()
	fauxqs.StopShared()
	os.Exit(code)
}

// The command as it is deployed, relay and consumer in one process
// (-role both, the default): the events of a FIFO queue are applied once,
// and SIGTERM stops it cleanly.
func TestCommandRunsBothRoles(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fq := fauxqs.Shared(t)
	queue := fauxqs.NewQueue(t, fq.Client(), true, nil)
	db := oncekittest.NewDB(t)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE invoices (seq bigserial PRIMARY KEY, event_id uuid NOT NULL, body jsonb NOT NULL)`)
	require.NoError(t, err)
	require.NoError(t, enqueue(ctx, db, 20, 4))

	logf, err := os.Create(filepath.Join(t.TempDir(), "sqs.log"))
	require.NoError(t, err)
	defer logf.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "AWS_ENDPOINT_URL="+fq.URL, "AWS_REGION=us-east-1", "AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test",
		argsEnv+"="+strings.Join([]string{"-queue-url", queue, "-fifo", "-database-url", db.URL, "-schema", db.Schema}, "\x1f"))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })

	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for applied := 0; applied < 20; {
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM invoices`).Scan(&applied))
		select {
		case <-tick.C:
		case <-ctx.Done():
			b, _ := os.ReadFile(logf.Name())
			t.Fatalf("%d of 20 applied: %v\n%s", applied, ctx.Err(), b[max(0, len(b)-3000):])
		}
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("still running after SIGTERM")
	}
	require.Equal(t, 0, cmd.ProcessState.ExitCode(), "a clean stop")
	var total, distinct int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id) FROM invoices`).Scan(&total, &distinct))
	require.Equal(t, 20, distinct)
	require.Equal(t, 20, total)
}

// enqueue writes events events over keys keys into the outbox in one
// transaction: the n-th event of a key carries n.
func enqueue(ctx context.Context, db *oncekittest.DB, events, keys int) error {
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
	if err != nil {
		return err
	}
	msgs := make([]broker.Message, events)
	for i := range msgs {
		key := fmt.Sprint("k", i%keys)
		body, _ := json.Marshal(map[string]any{"key": key, "n": i / keys})
		msgs[i] = broker.Message{ID: uuid.New(), Subject: "payments", Key: key, Payload: body}
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := ob.Enqueue(ctx, tx, msgs...); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	return tx.Commit(ctx)
}
