package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/crashpoint"
)

// helperRole runs this test binary as a helper process in mode (see
// runHelper).
func helperRole(t *testing.T, name, mode string) Role {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	return Role{Name: name, Path: self, Env: []string{helperEnv + "=" + mode}}
}

func newSupervisor(t *testing.T, cfg SupervisorConfig) *Supervisor {
	t.Helper()
	cfg.Dir = t.TempDir()
	s, err := NewSupervisor(cfg)
	require.NoError(t, err)
	t.Cleanup(s.Stop)
	return s
}

// alive reports whether pid is a live process (not a zombie).
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	return err == nil && !strings.Contains(string(stat), ") Z ")
}

// restarted waits until name runs with a PID other than old.
func restarted(ctx context.Context, t *testing.T, s *Supervisor, name string, old int) int {
	t.Helper()
	var pid int
	require.NoError(t, poll(ctx, func(context.Context) error {
		if pid = s.PID(name); pid == 0 || pid == old {
			return fmt.Errorf("%s not restarted", name)
		}
		return nil
	}))
	return pid
}

// up waits until the current start of name has printed that it is up.
func up(ctx context.Context, t *testing.T, s *Supervisor, name string) int {
	t.Helper()
	var pid int
	require.NoError(t, poll(ctx, func(context.Context) error {
		pid = s.PID(name)
		parts := helperLog(t, s, name)
		if pid == 0 || !strings.Contains(parts[len(parts)-1], fmt.Sprintf("up, pid %d\n", pid)) {
			return fmt.Errorf("%s is not up", name)
		}
		return nil
	}))
	return pid
}

// helperLog reads a role's log, split into one part per start.
func helperLog(t *testing.T, s *Supervisor, name string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.cfg.Dir, name+".log"))
	require.NoError(t, err)
	return strings.Split(string(b), "--- chaos supervisor: ")[1:]
}

func TestSupervisorRestartsKilledProcesses(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := newSupervisor(t, SupervisorConfig{Backoff: 20 * time.Millisecond})
	require.NoError(t, s.Start(helperRole(t, "api", "serve")))
	require.NoError(t, s.Start(helperRole(t, "relay", "serve")))
	require.Error(t, s.Start(helperRole(t, "api", "serve")), "a role name was used twice")

	first := up(ctx, t, s, "api")
	require.NoError(t, s.Kill("api"))
	assert.False(t, alive(first), "Kill returned before the process died")
	second := restarted(ctx, t, s, "api", first)
	assert.True(t, alive(second))

	relay := s.PID("relay")
	rng := rand.New(rand.NewPCG(1, 2))
	victim := s.KillRandom(rng)
	require.Contains(t, []string{"api", "relay"}, victim)
	old := map[string]int{"api": second, "relay": relay}[victim]
	assert.False(t, alive(old))
	restarted(ctx, t, s, victim, old)
	assert.ErrorIs(t, s.Kill("db"), ErrUnknownRole)

	st := s.Stats()
	assert.Equal(t, 2, st.Kills)
	assert.Equal(t, 4, st.Starts)
	assert.Zero(t, st.CrashPoints)
	assert.Empty(t, st.Exits)
	assert.Equal(t, 1+map[bool]int{true: 1}[victim == "api"], st.Roles["api"].Kills)

	pids := []int{up(ctx, t, s, "api"), up(ctx, t, s, "relay")}
	s.Stop()
	for _, pid := range pids {
		assert.False(t, alive(pid), "process %d outlived Stop", pid)
	}
	assert.Zero(t, s.PID("api"))
	assert.ErrorIs(t, s.Kill("api"), ErrNotRunning)
	assert.Equal(t, st, s.Stats(), "Stop's own terminations were counted as deaths")

	parts := helperLog(t, s, "api")
	require.Len(t, parts, st.Roles["api"].Starts)
	assert.Contains(t, parts[0], "helper serve up")
	assert.Contains(t, parts[len(parts)-1], "helper: SIGTERM, exiting", "Stop did not send SIGTERM first")
}

// A paused role does no work until Resume: its process is stopped, and
// one that dies meanwhile is restarted only at Resume (the failover's
// paused consumers would otherwise come back at once and drain the backlog
// the pause is there to build).
func TestSupervisorHoldsAPausedRole(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := newSupervisor(t, SupervisorConfig{Backoff: 10 * time.Millisecond})
	require.NoError(t, s.Start(helperRole(t, "consume", "serve")))
	first := up(ctx, t, s, "consume")

	require.NoError(t, s.Pause("consume"))
	require.NoError(t, poll(ctx, func(context.Context) error {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", first))
		if err != nil || !strings.Contains(string(stat), ") T ") {
			return fmt.Errorf("process %d is not stopped", first)
		}
		return nil
	}))
	require.NoError(t, s.Kill("consume"))
	assert.Never(t, func() bool { return s.PID("consume") != 0 }, 500*time.Millisecond, 10*time.Millisecond,
		"a paused role was restarted before Resume (50 backoffs)")
	assert.Equal(t, 1, s.Stats().Roles["consume"].Starts)

	require.NoError(t, s.Resume("consume"))
	restarted(ctx, t, s, "consume", first)
	assert.ErrorIs(t, s.Pause("db"), ErrUnknownRole)
}

func TestSupervisorTellsCrashPointsFromKillsAndExits(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	var hooked []int
	s := newSupervisor(t, SupervisorConfig{
		Backoff: 20 * time.Millisecond,
		// The first two starts die at the third hit of the crash point; the
		// third runs through and exits 7.
		StartEnv: func(name string, start int) []string {
			mu.Lock()
			hooked = append(hooked, start)
			mu.Unlock()
			if start > 2 {
				return nil
			}
			return []string{crashpoint.EnvVar + "=chaos.helper", crashpoint.EnvAfter + "=3"}
		},
	})
	require.NoError(t, s.Start(helperRole(t, "relay", "crash")))
	require.NoError(t, poll(ctx, func(context.Context) error {
		if s.Stats().Roles["relay"].Exits[7] == 0 {
			return fmt.Errorf("no exit 7 yet")
		}
		return nil
	}))
	s.Stop()

	st := s.Stats().Roles["relay"]
	assert.Equal(t, 2, st.CrashPoints, "deaths at the crash point")
	assert.Zero(t, st.Kills, "self-inflicted SIGKILLs counted as the supervisor's")
	assert.GreaterOrEqual(t, st.Exits[7], 1)
	assert.LessOrEqual(t, st.Exits[7], st.Starts-2, "more deaths than starts")
	assert.Len(t, st.Exits, 1, "exit codes other than 7: %v", st.Exits)
	mu.Lock()
	assert.Equal(t, []int{1, 2, 3}, hooked[:3])
	mu.Unlock()
	parts := helperLog(t, s, "relay")
	for i := range 2 {
		assert.Contains(t, parts[i], "crash point hit 3")
		assert.NotContains(t, parts[i], "crash point hit 4", "start %d outlived its crash point", i+1)
	}
	assert.Contains(t, parts[2], "crash point hit 5")
}

func TestSupervisorStopKillsWhatIgnoresSIGTERM(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := newSupervisor(t, SupervisorConfig{StopTimeout: 200 * time.Millisecond})
	require.NoError(t, s.Start(helperRole(t, "dispatcher", "deaf")))
	require.NoError(t, s.Start(helperRole(t, "consumer", "serve")))
	pids := []int{up(ctx, t, s, "dispatcher"), up(ctx, t, s, "consumer")}
	start := time.Now()
	s.Stop()
	assert.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond, "SIGKILL came before StopTimeout")
	for _, pid := range pids {
		assert.False(t, alive(pid), "process %d outlived Stop", pid)
	}
	st := s.Stats()
	assert.Zero(t, st.Kills+st.CrashPoints)
	assert.Empty(t, st.Exits)
}
