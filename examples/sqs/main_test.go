package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/examples/sqs/fauxqs"
	"github.com/oncekit/oncekit/oncekittest"
	"github.com/oncekit/oncekit/outbox"
)

// argsEnv, when set, makes the test binary run the command instead of the
// tests, with these arguments (separated by \x1f): the SIGKILL tests start
// the relay and the consumer that way, as separate processes.
const argsEnv = "ONCEKIT_SQS_EXAMPLE_ARGS"

func TestMain(m *testing.M) {
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
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	log := filepath.Join(t.TempDir(), "sqs.log")
	env := []string{"AWS_ENDPOINT_URL=" + fq.URL, "AWS_REGION=us-east-1", "AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test"}
	p := startProc(t, log, env, "-queue-url", queue, "-fifo", "-database-url", db.URL, "-schema", db.Schema)
	t.Cleanup(p.kill)
	require.NoError(t, enqueue(ctx, db, ob, 20, 4))
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for applied := 0; applied < 20; {
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM invoices`).Scan(&applied))
		select {
		case <-tick.C:
		case <-ctx.Done():
			b, _ := os.ReadFile(log)
			t.Fatalf("%d of 20 applied: %v\n%s", applied, ctx.Err(), tail(string(b), 3000))
		}
	}
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.done:
	case <-ctx.Done():
		t.Fatal("still running after SIGTERM")
	}
	require.Equal(t, 0, p.cmd.ProcessState.ExitCode(), "a clean stop")
	var total, distinct int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id) FROM invoices`).Scan(&total, &distinct))
	require.Equal(t, 20, distinct)
	require.Equal(t, 20, total)
}
