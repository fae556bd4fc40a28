package sideeffect_test

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/sideeffect"
)

// daemon is a real `oncekit dispatch` process.
type daemon struct {
	cmd    *exec.Cmd
	out    *testenv.SyncBuffer
	listen string
	done   chan error
}

func freeAddr(t testing.TB) string { return testenv.FreeAddr(t) }

// startDaemon runs `oncekit dispatch` with fast test timings plus args.
func startDaemon(t testing.TB, b *bundle, env []string, args ...string) *daemon {
	t.Helper()
	d := &daemon{out: &testenv.SyncBuffer{}, listen: freeAddr(t), done: make(chan error, 1)}
	all := append([]string{"dispatch", "--schema", b.db.Schema, "--listen", d.listen,
		"--poll-interval", "20ms", "--recover-interval", "100ms", "--min-backoff", "10ms", "--max-backoff", "50ms",
		"--lease", "3s", "--concurrency", "4"}, args...)
	d.cmd = exec.Command(testenv.OncekitBinary(t), all...)
	d.cmd.Env = append(os.Environ(), "DATABASE_URL="+b.db.URL, "ONCEKIT_CRASHPOINT=")
	d.cmd.Env = append(d.cmd.Env, env...)
	d.cmd.Stdout, d.cmd.Stderr = d.out, d.out
	require.NoError(t, d.cmd.Start())
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() {
		_ = d.cmd.Process.Kill()
		<-d.done
		if t.Failed() {
			t.Logf("oncekit dispatch output:\n%s", d.out)
		}
	})
	return d
}

// kill SIGKILLs the daemon and waits for it to be gone.
func (d *daemon) kill(t testing.TB) {
	t.Helper()
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGKILL))
	d.waitKilled(t)
}

func (d *daemon) waitKilled(t testing.TB) {
	t.Helper()
	select {
	case err := <-d.done:
		d.done <- err
		require.Error(t, err)
		ws := d.cmd.ProcessState.Sys().(syscall.WaitStatus)
		require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "want death by SIGKILL, got %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("daemon did not die")
	}
}

// stop sends SIGTERM and requires a clean exit.
func (d *daemon) stop(t testing.TB) {
	t.Helper()
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-d.done:
		d.done <- err
		require.NoError(t, err, "graceful shutdown")
	case <-time.After(30 * time.Second):
		t.Fatal("daemon did not stop on SIGTERM")
	}
}

func (d *daemon) metrics(t testing.TB) string {
	t.Helper()
	resp, err := http.Get("http://" + d.listen + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// oncekit runs a CLI command against the test's schema.
func runCLI(t testing.TB, b *bundle, args ...string) string {
	t.Helper()
	cmd := exec.Command(testenv.OncekitBinary(t), append(args, "--schema", b.db.Schema)...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+b.db.URL)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "oncekit %v: %s", args, out)
	return string(out)
}

// The dispatcher is SIGKILLed while its calls are at the provider (after
// the fired commit, before the answer). The provider acted on them. After a
// restart the lease expires, the effects are fired again with the SAME
// keys, and the provider's dedup leaves exactly one effect per key.
func TestDispatcherKilledMidCallRefiresWithSameKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t)
	keys := b.record(t, "ship", 20)
	var armed atomic.Bool
	armed.Store(true)
	midCall := make(chan string, 100)
	rc.setHook(func(w http.ResponseWriter, r *http.Request, key string, n int) bool {
		if armed.Load() {
			rc.record(key) // the provider acts; its answer never arrives
			midCall <- key
			waitCtx(r.Context())
			return true
		}
		return false
	})
	d := startDaemon(t, b, nil, "--endpoint", "ship="+rc.URL, "--secret", testSecret, "--timeout", "1s")
	var killed string
	select {
	case killed = <-midCall:
	case <-time.After(30 * time.Second):
		t.Fatalf("no call reached the provider: %s", d.out)
	}
	d.kill(t)
	armed.Store(false)
	row := b.rowByKey(t, killed)
	require.Equal(t, sideeffect.StateFired, row.State, "fired was committed before the call")

	d2 := startDaemon(t, b, nil, "--endpoint", "ship="+rc.URL, "--secret", testSecret, "--timeout", "1s")
	b.waitState(t, sideeffect.StateConfirmed, len(keys), 30*time.Second)
	rc.check(t, keys) // one effect per key; every call carried a known key
	require.GreaterOrEqual(t, rc.callsOf(killed), 2, "the killed call was repeated")
	require.GreaterOrEqual(t, b.rowByKey(t, killed).Attempts, 2)
	require.Contains(t, d2.metrics(t), `oncekit_sideeffect_provider_duplicates_total{kind="ship"}`)
	d2.stop(t)
}

// The dispatcher dies at a named crash point: right after committing fired
// (before any call), or after the provider answered but before the outcome
// is committed. After a restart every effect happens exactly once, each call
// with its effect's key.
func TestDispatcherCrashPoints(t *testing.T) {
	t.Parallel()
	for _, point := range []string{"sideeffect.after-fired", "sideeffect.before-complete"} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			rc := newReceiver(t)
			keys := b.record(t, "mail", 30)
			d := startDaemon(t, b, []string{"ONCEKIT_CRASHPOINT=" + point},
				"--endpoint", "mail="+rc.URL, "--secret", testSecret, "--timeout", "1s")
			d.waitKilled(t)
			fired := b.countState(t, sideeffect.StateFired)
			require.Positive(t, fired, "rows stay fired after the crash")
			if point == "sideeffect.after-fired" {
				require.Zero(t, rc.totalCalls(), "the crash came before any call")
			} else {
				require.Positive(t, rc.totalCalls(), "the provider acted before the crash")
			}

			d2 := startDaemon(t, b, nil, "--endpoint", "mail="+rc.URL, "--secret", testSecret, "--timeout", "1s")
			b.waitState(t, sideeffect.StateConfirmed, len(keys), 30*time.Second)
			rc.check(t, keys) // one effect per key, only known keys
			resp, err := http.Get("http://" + d2.listen + "/healthz")
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.NoError(t, resp.Body.Close())
			d2.stop(t)
		})
	}
}

// A provider that ignores keys and offers no lookup; the dispatcher is killed
// mid-call. The effect becomes unknown (CLI, metrics) and is never fired
// again until an operator decides.
func TestKilledMidCallWithoutKeysBecomesUnknown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t)
	key := b.record(t, "sms", 1)[0]
	var armed atomic.Bool
	armed.Store(true)
	midCall := make(chan string, 10)
	rc.setHook(func(w http.ResponseWriter, r *http.Request, k string, n int) bool {
		if armed.Load() {
			rc.record(k)
			midCall <- k
			waitCtx(r.Context())
			return true
		}
		return false
	})
	cfg, err := json.Marshal(map[string]any{"endpoints": map[string]any{
		"sms":   map[string]any{"url": rc.URL, "secret": testSecret, "timeout": "1s", "keys_ignored": true},
		"probe": map[string]any{"url": rc.URL, "secret": testSecret, "timeout": "1s"},
	}})
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "dispatch.json")
	require.NoError(t, os.WriteFile(path, cfg, 0o600))

	d := startDaemon(t, b, nil, "--config", path)
	select {
	case <-midCall:
	case <-time.After(30 * time.Second):
		t.Fatalf("no call reached the provider: %s", d.out)
	}
	d.kill(t)
	armed.Store(false)

	d2 := startDaemon(t, b, nil, "--config", path)
	b.waitState(t, sideeffect.StateUnknown, 1, 30*time.Second)
	id := b.rowByKey(t, key).ID

	list := runCLI(t, b, "effects", "list", "--state", "unknown")
	require.Contains(t, list, strconv.FormatInt(id, 10))
	require.Contains(t, list, "sms")
	require.Eventually(t, func() bool {
		m := d2.metrics(t)
		return strings.Contains(m, `oncekit_sideeffect_unknown_effects{kind="sms"} 1`) &&
			strings.Contains(m, `oncekit_sideeffect_transitions_total{kind="sms",state="unknown"} 1`)
	}, 10*time.Second, 20*time.Millisecond)

	// The daemon keeps dispatching other effects and never calls this one
	// again.
	probe := b.record(t, "probe", 1)[0]
	require.Eventually(t, func() bool { return b.rowByKey(t, probe).State == sideeffect.StateConfirmed }, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, 1, rc.callsOf(key), "an unknown effect is not fired again")

	// The operator checked the provider and records the decision.
	out := runCLI(t, b, "effects", "resolve", strconv.FormatInt(id, 10), "confirmed", "--by", "ana", "--reason", "seen in the SMS dashboard")
	require.Contains(t, out, "resolved as confirmed")
	row := b.rowByKey(t, key)
	require.Equal(t, sideeffect.StateConfirmed, row.State)
	require.Equal(t, "ana", row.ResolvedBy)
	require.Equal(t, "seen in the SMS dashboard", row.ResolutionNote)
	require.Equal(t, 1, rc.callsOf(key))
	d2.stop(t)
}
