package outbox_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/crashpoint"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// relayProc is a real `oncekit relay` process.
type relayProc struct {
	cmd    *exec.Cmd
	out    *testenv.SyncBuffer
	exited chan struct{}
	err    error
}

// startRelayProc starts `oncekit relay` on b's schema; extraEnv is added to
// the environment. It is killed when the test ends, and its log printed if
// the test failed.
func startRelayProc(t *testing.T, b *bundle, natsURL string, extraEnv []string, args ...string) *relayProc {
	t.Helper()
	bin := testenv.OncekitBinary(t)
	base := []string{"relay", "--database-url", b.db.URL, "--schema", b.db.Schema, "--nats-url", natsURL,
		"--lease", "2s", "--poll-interval", "100ms", "--publish-timeout", "2s", "--log-level", "debug"}
	cmd := exec.Command(bin, append(base, args...)...)
	cmd.Env = append(os.Environ(), extraEnv...)
	p := &relayProc{cmd: cmd, out: &testenv.SyncBuffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	require.NoError(t, cmd.Start())
	go func() { p.err = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("relay %d output:\n%s", cmd.Process.Pid, p.out.String())
		}
	})
	return p
}

func (p *relayProc) wait(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(within):
		t.Fatalf("relay did not exit within %v:\n%s", within, p.out.String())
	}
}

func TestThreeRelayProcessesKeepEachKeyInOrder(t *testing.T) {
	if testing.Short() {
		t.Skip("3 relay processes, 20,000 events")
	}
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const keys, perKey, writers = 1000, 20, 4
	want := make([]broker.Message, 0, keys*perKey)
	byKey := make([][]broker.Message, keys)
	for k := range keys {
		for i := range perKey {
			m := b.msg(fmt.Sprintf("key-%04d", k), i)
			byKey[k] = append(byKey[k], m)
			want = append(want, m)
		}
	}
	// write runs the writers concurrently over rounds [from, to): in each
	// transaction, event i of a quarter of the keys.
	write := func(from, to int) {
		var wg sync.WaitGroup
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := from; i < to; i++ {
					var batch []broker.Message
					for k := w; k < keys; k += writers {
						batch = append(batch, byKey[k][i])
					}
					enqueue(t, b.db, b.ob, batch...)
				}
			}()
		}
		wg.Wait()
	}
	owners := func() (n int) {
		require.NoError(t, b.db.Pool.QueryRow(ctx,
			`SELECT count(DISTINCT owner) FROM relay_partitions WHERE expires_at > now()`).Scan(&n))
		return n
	}

	// One relay starts alone; two more join while the first half is being
	// written, so partitions move between processes under load.
	first := startRelayProc(t, b, b.nats.URL, nil)
	done := make(chan struct{})
	go func() { write(0, perKey/2); close(done) }()
	waitCount(t, b.stream, 2000, 60*time.Second)
	others := []*relayProc{startRelayProc(t, b, b.nats.URL, nil), startRelayProc(t, b, b.nats.URL, nil)}
	require.Eventually(t, func() bool { return owners() == 3 }, 30*time.Second, 50*time.Millisecond, "every relay takes a share")
	<-done

	// The first relay dies without a word; the others take its partitions
	// once its leases expire, and the second half is written meanwhile.
	require.NoError(t, first.cmd.Process.Signal(syscall.SIGKILL))
	first.wait(t, 10*time.Second)
	write(perKey/2, perKey)
	waitCount(t, b.stream, keys*perKey, 120*time.Second)
	requireExactlyOnceInOrder(t, readStream(t, b.stream), want)
	require.Eventually(t, func() bool { return owners() == 2 }, 30*time.Second, 50*time.Millisecond)

	// SIGTERM: each finishes its batch, gives its leases back and exits 0.
	for _, p := range others {
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	}
	for _, p := range others {
		p.wait(t, 30*time.Second)
		require.NoError(t, p.err, p.out.String())
	}
	var held int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM relay_partitions WHERE owner IS NOT NULL`).Scan(&held))
	require.Zero(t, held)
}

func TestRelayProcessKilledAfterPublishBeforeMark(t *testing.T) {
	t.Parallel()
	b, srv := withRestartableBroker(t)
	url := srv.url

	var want []broker.Message
	for i := range 300 {
		want = append(want, b.msg(fmt.Sprintf("k%d", i%7), i))
	}
	enqueue(t, b.db, b.ob, want...)

	// The relay publishes its first batch, then dies before marking it.
	p := startRelayProc(t, b, url, []string{crashpoint.EnvVar + "=relay.after-publish"})
	p.wait(t, 60*time.Second)
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "killed at the crash point: %v\n%s", p.err, p.out.String())
	published := streamCount(t, b.stream)
	require.NotZero(t, published, "the batch reached the broker")
	require.Zero(t, publishedRows(t, b.db), "nothing was marked")
	require.EqualValues(t, len(want), backlog(t, b))

	// The broker restarts too (same store, same port); its dedup state
	// survives, so the re-published batch is absorbed.
	srv.stop()
	srv.start()
	require.Equal(t, published, streamCount(t, b.stream))

	startRelayProc(t, b, url, nil)
	waitCount(t, b.stream, uint64(len(want)), 60*time.Second)
	require.Eventually(t, func() bool { return publishedRows(t, b.db) == len(want) }, 30*time.Second, 20*time.Millisecond)
	require.Zero(t, backlog(t, b))
	requireExactlyOnceInOrder(t, readStream(t, b.stream), want)
}

func TestRelayProcessFailsFastOnUnreachableDependencies(t *testing.T) {
	t.Parallel()
	b := &bundle{db: testenv.NewDB(t)}
	bin := testenv.OncekitBinary(t)
	run := func(args ...string) (int, string) {
		out, err := exec.Command(bin, args...).CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else {
			require.NoError(t, err)
		}
		return code, string(out)
	}
	code, out := run("relay", "--database-url", b.db.URL, "--schema", b.db.Schema, "--nats-url", "nats://127.0.0.1:1")
	require.Equal(t, 1, code)
	require.Contains(t, out, "NATS at nats://127.0.0.1:1 is unreachable")
	code, out = run("relay", "--database-url", "postgres://postgres@127.0.0.1:1/postgres", "--nats-url", "nats://127.0.0.1:1")
	require.Equal(t, 1, code)
	require.Contains(t, out, "PostgreSQL at 127.0.0.1:1 is unreachable")
	code, out = run("relay", "--database-url", b.db.URL, "--schema", "no_such_schema_here")
	require.Equal(t, 1, code)
	require.Contains(t, out, "oncekit migrate up")
	code, _ = run("relay", "--database-url", b.db.URL, "--batch", "-1", "--schema", b.db.Schema)
	require.NotZero(t, code)
}

func TestOutboxCommandListsAndUnparks(t *testing.T) {
	t.Parallel()
	b := &bundle{db: testenv.NewDB(t), name: testenv.Name(t)}
	b.subject = b.name + ".ev"
	b.ob = newOutbox(t, b.db, outbox.Config{})
	m := b.msg("k", 1)
	enqueue(t, b.db, b.ob, m, b.msg("k", 2))
	_, err := b.db.Pool.Exec(context.Background(), `UPDATE outbox SET parked_at = now(), attempts = 10, last_error = 'no stream' WHERE id = $1`, m.ID)
	require.NoError(t, err)
	bin := testenv.OncekitBinary(t)
	run := func(args ...string) string {
		full := append([]string{args[0], args[1], "--database-url", b.db.URL, "--schema", b.db.Schema}, args[2:]...)
		out, err := exec.Command(bin, full...).CombinedOutput()
		require.NoError(t, err, string(out))
		return string(out)
	}
	out := run("outbox", "parked")
	require.Contains(t, out, m.ID.String())
	require.Contains(t, out, "no stream")
	require.Contains(t, run("outbox", "list"), "pending")
	require.Contains(t, run("outbox", "unpark", m.ID.String()), "unparked 1 message(s)")
	require.Contains(t, run("outbox", "list", "--state", "parked"), "(none)")
	raw, err := exec.Command(bin, "outbox", "unpark", "--database-url", b.db.URL).CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(raw), "give message IDs or --all")
}

func TestRelayProcessServesHealthAndMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	p := startRelayProc(t, b, b.nats.URL, nil, "--listen", addr)
	enqueue(t, b.db, b.ob, b.msg("k", 1))
	waitCount(t, b.stream, 1, 30*time.Second)
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	require.Eventually(t, func() bool { code, _ := get("/healthz"); return code == http.StatusOK }, 20*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool {
		_, body := get("/metrics")
		return strings.Contains(body, "oncekit_outbox_published_total 1") && strings.Contains(body, "oncekit_outbox_partitions_owned 16")
	}, 20*time.Second, 50*time.Millisecond)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	p.wait(t, 30*time.Second)
	require.NoError(t, p.err)
}
