package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/examples/sqs/fauxqs"
	"github.com/oncekit/oncekit/oncekittest"
	"github.com/oncekit/oncekit/outbox"
)

// proc is the command running as a child process, its output in a file.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// startProc runs the command with args and env as a child of the test,
// SIGKILLed if the test process dies.
func startProc(t *testing.T, logPath string, env []string, args ...string) *proc {
	t.Helper()
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	require.NoError(t, err)
	defer logf.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), env...), argsEnv+"="+strings.Join(args, "\x1f"))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	return p
}

// kill SIGKILLs the process and waits until it is gone.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// payload is an event of the SIGKILL runs: the n-th event of its key.
type payload struct {
	Key string `json:"key"`
	N   int    `json:"n"`
}

// killRun is the outcome of one SIGKILL run, printed as one JSON line.
type killRun struct {
	Queue             string  `json:"queue"`
	Events            int     `json:"events"`
	RelayKills        int     `json:"relay_kills"`
	ConsumerKills     int     `json:"consumer_kills"`
	Lost              int     `json:"lost"`
	DuplicatesApplied int     `json:"duplicates_applied"`
	OrderViolations   int     `json:"order_violations"`
	Seconds           float64 `json:"seconds"`
}

// The relay and the consumer of the example run as processes of their own
// on a standard and a FIFO queue of fauxqs (which keeps running), and are
// SIGKILLed at random moments while events are enqueued: every event is
// applied once, and on the FIFO queue each key's events (a message group)
// in their order. Run with -v for the summary line of each queue.
func TestRelayAndConsumerSIGKILLed(t *testing.T) {
	for _, fifo := range []bool{false, true} {
		name := map[bool]string{false: "standard", true: "fifo"}[fifo]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := sigkillRun(t, fifo)
			line, err := json.Marshal(r)
			require.NoError(t, err)
			t.Logf("SIGKILL run: %s", line)
			require.Zero(t, r.Lost, "events lost")
			require.Zero(t, r.DuplicatesApplied, "events applied twice")
			if fifo {
				require.Zero(t, r.OrderViolations, "a group's events out of order")
			}
			require.Positive(t, r.RelayKills)
			require.Positive(t, r.ConsumerKills)
		})
	}
}

func sigkillRun(t *testing.T, fifo bool) killRun {
	const (
		events = 400
		keys   = 8
		kills  = 10
	)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	start := time.Now()
	fq := fauxqs.Shared(t)
	client := fq.Client()
	queue := fauxqs.NewQueue(t, client, fifo, nil)
	db := oncekittest.NewDB(t)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE invoices (seq bigserial PRIMARY KEY, event_id uuid NOT NULL, body jsonb NOT NULL)`)
	require.NoError(t, err)
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
	require.NoError(t, err)

	logs := t.TempDir()
	env := []string{"AWS_ENDPOINT_URL=" + fq.URL, "AWS_REGION=us-east-1", "AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test"}
	args := func(role string) []string {
		return []string{"-queue-url", queue, fmt.Sprintf("-fifo=%v", fifo), "-database-url", db.URL, "-schema", db.Schema,
			"-role", role, "-ack-wait", "2s", "-lease", "1s"}
	}
	procs := map[string]*proc{}
	for _, role := range []string{"relay", "consumer"} {
		procs[role] = startProc(t, filepath.Join(logs, role+".log"), env, args(role)...)
	}
	t.Cleanup(func() {
		for _, p := range procs {
			p.kill()
		}
		if t.Failed() {
			for _, role := range []string{"relay", "consumer"} {
				b, _ := os.ReadFile(filepath.Join(logs, role+".log"))
				t.Logf("%s's log:\n%s", role, tail(string(b), 3000))
			}
		}
	})

	// Enqueue in transactions of 5 while the kills go on, and kill until
	// both the kills and the enqueuing are done.
	enqueued := make(chan error, 1)
	go func() {
		enqueued <- enqueue(ctx, db, ob, events, keys)
	}()
	r := killRun{Queue: map[bool]string{false: "standard", true: "fifo"}[fifo], Events: events}
	var enqueueErr error
	done := false
	for i := 0; i < kills || !done; i++ {
		select {
		case enqueueErr = <-enqueued:
			done = true
		default:
		}
		select {
		case <-time.After(time.Duration(200+rand.IntN(1000)) * time.Millisecond): // a random moment
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
		role := []string{"relay", "consumer"}[i%2]
		if rand.IntN(3) == 0 {
			role = []string{"relay", "consumer"}[rand.IntN(2)]
		}
		procs[role].kill()
		procs[role] = startProc(t, filepath.Join(logs, role+".log"), env, args(role)...)
		if role == "relay" {
			r.RelayKills++
		} else {
			r.ConsumerKills++
		}
	}
	require.NoError(t, enqueueErr)

	// Every event applied, and nothing left in the queue (no copy still to
	// come).
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		var distinct int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(DISTINCT event_id) FROM invoices`).Scan(&distinct))
		if distinct == events && queueEmpty(ctx, t, client, queue) {
			break
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("%d of %d events applied: %v", distinct, events, ctx.Err())
		}
	}
	var total, distinct int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id) FROM invoices`).Scan(&total, &distinct))
	r.Lost, r.DuplicatesApplied = events-distinct, total-distinct
	require.NoError(t, db.Pool.QueryRow(ctx, `
		SELECT count(*) FROM (
			SELECT (body->>'n')::int AS n, lag((body->>'n')::int) OVER (PARTITION BY body->>'key' ORDER BY seq) AS prev
			FROM invoices) s
		WHERE n <= prev`).Scan(&r.OrderViolations))
	r.Seconds = time.Since(start).Round(100 * time.Millisecond).Seconds()
	return r
}

// enqueue writes events events over keys keys into the outbox, in
// transactions of 5, one every 60 ms or so: the n-th event of a key
// carries n.
func enqueue(ctx context.Context, db *oncekittest.DB, ob *outbox.Outbox, events, keys int) error {
	next := make([]int, keys)
	for i := 0; i < events; {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			return err
		}
		var msgs []broker.Message
		for ; i < events && len(msgs) < 5; i++ {
			k := i % keys
			body, _ := json.Marshal(payload{Key: fmt.Sprint("k", k), N: next[k]})
			next[k]++
			msgs = append(msgs, broker.Message{ID: uuid.New(), Subject: "payments", Key: fmt.Sprint("k", k), Payload: body})
		}
		if _, err := ob.Enqueue(ctx, tx, msgs...); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		select {
		case <-time.After(60 * time.Millisecond): // a steady trickle, spread over the kills
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// queueEmpty reports whether queue holds no message, visible or in flight.
func queueEmpty(ctx context.Context, t *testing.T, client *sqs.Client, queue string) bool {
	out, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(queue), AttributeNames: []types.QueueAttributeName{
		types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
		types.QueueAttributeNameApproximateNumberOfMessagesDelayed,
	}})
	require.NoError(t, err)
	for _, v := range out.Attributes {
		if v != "0" {
			return false
		}
	}
	return true
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
