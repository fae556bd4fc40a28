package fleet_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox/fleet"
)

// startMemberProc starts `oncekit relay --fleet file` as member id; it is
// killed when the test ends, and its log printed if the test failed.
func startMemberProc(t *testing.T, w *world, file, id string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(testenv.OncekitBinary(t), "relay", "--fleet", file, "--id", id, "--nats-url", w.nats.URL,
		"--fleet-bucket", w.name, "--fleet-member-ttl", "1500ms", "--fleet-replicas", "2",
		"--lease", "2s", "--poll-interval", "100ms", "--publish-timeout", "2s")
	out := &testenv.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("member %s output:\n%s", id, out.String())
		}
	})
	return cmd
}

// Three member processes serve three databases (k = 2) while writers
// write; one is SIGKILLed. Its partitions are owned again within its
// entry's TTL and one lease, and the stream holds every event exactly once.
func TestMemberKilledLosesNothingAndPublishesNothingTwice(t *testing.T) {
	if testing.Short() {
		t.Skip("three oncekit processes")
	}
	t.Parallel()
	w := newWorld(t)
	var outs []*outboxDB
	var dbs []fleet.Database
	for i := range 3 {
		o := newOutboxDB(t, fmt.Sprintf("db%d", i))
		outs = append(outs, o)
		dbs = append(dbs, o.def)
	}
	file := filepath.Join(t.TempDir(), "fleet.json")
	raw, err := json.Marshal(dbs)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(file, raw, 0o600))
	procs := map[string]*exec.Cmd{}
	for _, id := range []string{"m1", "m2", "m3"} {
		procs[id] = startMemberProc(t, w, file, id)
	}

	var mu sync.Mutex
	var all []broker.Message
	stop := make(chan struct{})
	var writers sync.WaitGroup
	var once sync.Once
	halt := func() { once.Do(func() { close(stop) }); writers.Wait() }
	t.Cleanup(halt)
	for i, o := range outs {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				msgs, err := w.tryEnqueue(o, fmt.Sprintf("k%d-%d", i, j%7), 5)
				if err != nil {
					t.Errorf("enqueue: %v", err)
					return
				}
				mu.Lock()
				all = append(all, msgs...)
				mu.Unlock()
			}
		}()
	}
	count := func() uint64 {
		info, err := w.stream.Info(context.Background())
		if err != nil {
			return 0
		}
		return info.State.Msgs
	}
	require.Eventually(t, func() bool { return count() > 300 }, 60*time.Second, 20*time.Millisecond)

	// The victim is the member assigned the most databases; once it holds
	// leases in each, it is killed without a word.
	victim, most := "", 0
	for _, id := range []string{"m1", "m2", "m3"} {
		n := 0
		for _, d := range dbs {
			if slices.Contains(fleet.Assign(d.Name, []string{"m1", "m2", "m3"}, 2), id) {
				n++
			}
		}
		if n > most {
			victim, most = id, n
		}
	}
	owned := func(o *outboxDB, owner string, not bool) (n int) {
		op := "="
		if not {
			op = "<>"
		}
		require.NoError(t, o.db.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM relay_partitions WHERE expires_at > now() AND owner IS NOT NULL AND owner `+op+` $1`, owner).Scan(&n))
		return n
	}
	require.Eventually(t, func() bool {
		for _, o := range outs {
			if slices.Contains(fleet.Assign(o.def.Name, []string{"m1", "m2", "m3"}, 2), victim) && owned(o, victim, false) == 0 {
				return false
			}
		}
		return true
	}, 60*time.Second, 20*time.Millisecond, "the victim holds leases in its databases")
	require.NoError(t, procs[victim].Process.Signal(syscall.SIGKILL))
	killed := time.Now()
	require.Eventually(t, func() bool {
		for _, o := range outs {
			if owned(o, victim, true) < 16 {
				return false
			}
		}
		return true
	}, 60*time.Second, 20*time.Millisecond, "every partition of every database owned again by the living")
	t.Logf("member %s killed: every partition owned again after %v (member TTL 1.5s, lease 2s)", victim, time.Since(killed).Round(10*time.Millisecond))
	// One lease (2s) and a lease loop's period when the machine is quiet;
	// its load adds scheduling delays.
	require.Less(t, time.Since(killed), 1500*time.Millisecond+3*2*time.Second)
	n := count()
	require.Eventually(t, func() bool { return count() > n+300 }, 60*time.Second, 20*time.Millisecond, "events flow on")
	halt()

	mu.Lock()
	msgs := slices.Clone(all)
	mu.Unlock()
	require.Eventually(t, func() bool { return count() >= uint64(len(msgs)) }, 60*time.Second, 20*time.Millisecond)
	w.requireStoredOnce(t, msgs)
	t.Logf("%d events over %d databases, each in the stream once", len(msgs), len(outs))
}
