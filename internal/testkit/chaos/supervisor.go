package chaos

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"
)

// Role is one named process a Supervisor runs and restarts.
type Role struct {
	Name string   // unique among the supervisor's roles; its log is <Dir>/<Name>.log
	Path string   // the binary
	Args []string // its arguments
	Env  []string // KEY=value pairs added to this process's environment
}

// SupervisorConfig configures a Supervisor.
type SupervisorConfig struct {
	// Dir receives one log file per role, stdout and stderr of every start
	// appended. Required.
	Dir string
	// Backoff is the pause between a death and the restart. Defaults to
	// 100 ms.
	Backoff time.Duration
	// StopTimeout is how long Stop waits after SIGTERM before SIGKILL.
	// Defaults to 5 s.
	StopTimeout time.Duration
	// StartEnv, when set, returns KEY=value pairs added to the environment of
	// one start of a role (start counts from 1: the first start is 1, the
	// first restart 2), after Role.Env, so it wins. A chaos run arms a crash
	// point on some starts with it, e.g. ONCEKIT_CRASHPOINT and
	// ONCEKIT_CRASHPOINT_AFTER.
	StartEnv func(name string, start int) []string
	// Logger receives a line per start and death. Defaults to discarding.
	Logger *slog.Logger
}

// ProcessStats counts the starts and deaths of one role, or of all of them.
// Deaths caused by Stop are not counted.
type ProcessStats struct {
	Starts int // processes started
	// Kills counts deaths by a SIGKILL the supervisor sent (Kill, KillRandom).
	Kills int
	// CrashPoints counts deaths by a SIGKILL the supervisor did not send:
	// the process killed itself, at a crash point.
	CrashPoints int
	// Exits counts the other deaths by exit code; a death by another signal
	// counts as 128+signal, as a shell reports it.
	Exits map[int]int
}

// SupervisorStats holds the counts summed over every role, and per role.
type SupervisorStats struct {
	ProcessStats
	Roles map[string]ProcessStats
}

// Supervisor runs named roles as OS processes and restarts each one when it
// dies, after Backoff, until Stop. It kills them on demand and counts deaths
// by cause. Every process gets SIGKILL if the supervising process dies, so a
// crashed test leaves none behind. Its methods are safe for concurrent use.
type Supervisor struct {
	cfg SupervisorConfig

	mu       sync.Mutex
	roles    map[string]*role
	stopping bool
	stopped  chan struct{} // closed by Stop
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// role is one Role's state; guarded by Supervisor.mu.
type role struct {
	Role
	proc     *process // nil between a death and the restart
	killSent bool     // the supervisor sent SIGKILL to proc
	// resumed is non-nil while the role is paused, and closed by Resume:
	// a restart waits for it.
	resumed chan struct{}
	stats   ProcessStats
}

// NewSupervisor returns a Supervisor with cfg's defaults filled in.
func NewSupervisor(cfg SupervisorConfig) (*Supervisor, error) {
	if cfg.Dir == "" {
		return nil, errors.New("chaos: SupervisorConfig.Dir is required")
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = 100 * time.Millisecond
	}
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Supervisor{cfg: cfg, roles: map[string]*role{}, stopped: make(chan struct{})}, nil
}

// Start starts r now and keeps it running until Stop. It fails if r's name
// is taken, the supervisor is stopped, or the first start fails.
func (s *Supervisor) Start(r Role) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return errors.New("chaos: supervisor stopped")
	}
	if r.Name == "" || s.roles[r.Name] != nil {
		return fmt.Errorf("chaos: role name %q is empty or taken", r.Name)
	}
	ro := &role{Role: r, stats: ProcessStats{Exits: map[int]int{}}}
	if err := s.start(ro); err != nil {
		return err
	}
	s.roles[r.Name] = ro
	s.wg.Add(1)
	go s.watch(ro)
	return nil
}

// start starts one process of ro; s.mu is held.
func (s *Supervisor) start(ro *role) error {
	n := ro.stats.Starts + 1
	env := append(append(os.Environ(), ro.Env...), s.startEnv(ro.Name, n)...)
	logPath := filepath.Join(s.cfg.Dir, ro.Name+".log")
	if f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
		fmt.Fprintf(f, "--- chaos supervisor: %s start %d at %s\n", ro.Name, n, time.Now().UTC().Format(time.RFC3339Nano))
		f.Close()
	}
	p, err := startProcess(ro.Path, ro.Args, env, logPath)
	if err != nil {
		return err
	}
	ro.proc, ro.killSent = p, false
	ro.stats.Starts = n
	s.cfg.Logger.Info("chaos: started", "role", ro.Name, "start", n, "pid", p.cmd.Process.Pid)
	return nil
}

func (s *Supervisor) startEnv(name string, start int) []string {
	if s.cfg.StartEnv == nil {
		return nil
	}
	return s.cfg.StartEnv(name, start)
}

// watch waits for each death of ro's process, counts it and restarts it.
func (s *Supervisor) watch(ro *role) {
	defer s.wg.Done()
	for {
		s.mu.Lock()
		p := ro.proc
		s.mu.Unlock()
		if p != nil {
			<-p.done
			s.mu.Lock()
			if !s.stopping {
				s.countDeath(ro, p)
			}
			ro.proc = nil
			s.mu.Unlock()
		}
		t := time.NewTimer(s.cfg.Backoff)
		select {
		case <-s.stopped:
			t.Stop()
			return
		case <-t.C:
		}
		s.mu.Lock()
		for ro.resumed != nil && !s.stopping {
			held := ro.resumed
			s.mu.Unlock()
			select {
			case <-s.stopped:
			case <-held:
			}
			s.mu.Lock()
		}
		if s.stopping {
			s.mu.Unlock()
			return
		}
		if err := s.start(ro); err != nil {
			s.cfg.Logger.Error("chaos: restart failed", "role", ro.Name, "err", err)
		}
		s.mu.Unlock()
	}
}

// countDeath classifies the death of p; s.mu is held.
func (s *Supervisor) countDeath(ro *role, p *process) {
	ws, _ := p.state.Sys().(syscall.WaitStatus)
	switch {
	case ws.Signaled() && ws.Signal() == syscall.SIGKILL && ro.killSent:
		ro.stats.Kills++
		s.cfg.Logger.Info("chaos: killed", "role", ro.Name)
	case ws.Signaled() && ws.Signal() == syscall.SIGKILL:
		ro.stats.CrashPoints++
		s.cfg.Logger.Info("chaos: died at a crash point", "role", ro.Name)
	case ws.Signaled():
		ro.stats.Exits[128+int(ws.Signal())]++
		s.cfg.Logger.Warn("chaos: died by a signal", "role", ro.Name, "signal", ws.Signal().String())
	default:
		ro.stats.Exits[ws.ExitStatus()]++
		s.cfg.Logger.Warn("chaos: exited", "role", ro.Name, "code", ws.ExitStatus())
	}
}

// ErrNotRunning is returned by Supervisor.Kill when the named process is not
// running (between a death and its restart, or after Stop).
var ErrNotRunning = errors.New("chaos: process not running")

// ErrUnknownRole is returned by Supervisor.Kill for a name never started.
var ErrUnknownRole = errors.New("chaos: no such role")

// Kill sends SIGKILL to the named role's process, waits until it is gone and
// counts the death as a kill. The supervisor restarts it after Backoff.
func (s *Supervisor) Kill(name string) error {
	s.mu.Lock()
	ro := s.roles[name]
	if ro == nil {
		s.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrUnknownRole, name)
	}
	p := ro.proc
	if p == nil || p.exited() || s.stopping {
		s.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrNotRunning, name)
	}
	ro.killSent = true
	s.mu.Unlock()
	return p.kill()
}

// Pause stops the named role's process (SIGSTOP) until Resume: it holds
// its connections and does nothing, as a process stalled by a long pause
// of its runtime or its host would. The role is held until Resume: a
// process that dies meanwhile (killed, or not running when Pause is
// called) is restarted only then, so that the role does no work while
// paused. It fails for a name never started.
func (s *Supervisor) Pause(name string) error { return s.hold(name, true) }

// Resume continues a process Pause stopped (SIGCONT), or lets the role's
// held restart go ahead.
func (s *Supervisor) Resume(name string) error { return s.hold(name, false) }

// hold pauses the named role (Pause) or resumes it (Resume).
func (s *Supervisor) hold(name string, pause bool) error {
	s.mu.Lock()
	ro := s.roles[name]
	if ro == nil {
		s.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrUnknownRole, name)
	}
	sig := syscall.SIGCONT
	switch {
	case pause && ro.resumed == nil:
		ro.resumed = make(chan struct{})
	case !pause && ro.resumed != nil:
		close(ro.resumed)
		ro.resumed = nil
	}
	if pause {
		sig = syscall.SIGSTOP
	}
	p := ro.proc
	s.mu.Unlock()
	if p == nil {
		return nil // a held restart: it starts at Resume
	}
	return p.signal(sig)
}

// KillRandom kills one running process chosen with rng (roles taken in name
// order, so a seeded rng repeats its choices) and returns its role's name,
// or "" when none is running.
func (s *Supervisor) KillRandom(rng *rand.Rand) string {
	s.mu.Lock()
	var running []string
	for name, ro := range s.roles {
		if ro.proc != nil && !ro.proc.exited() {
			running = append(running, name)
		}
	}
	s.mu.Unlock()
	if len(running) == 0 {
		return ""
	}
	slices.Sort(running)
	name := running[rng.IntN(len(running))]
	if err := s.Kill(name); err != nil {
		return ""
	}
	return name
}

// PID returns the process ID of the named role's running process, or 0.
func (s *Supervisor) PID(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ro := s.roles[name]; ro != nil && ro.proc != nil && !ro.proc.exited() {
		return ro.proc.cmd.Process.Pid
	}
	return 0
}

// Stats returns the counts so far.
func (s *Supervisor) Stats() SupervisorStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := SupervisorStats{ProcessStats: ProcessStats{Exits: map[int]int{}}, Roles: map[string]ProcessStats{}}
	for name, ro := range s.roles {
		rs := ro.stats
		rs.Exits = maps.Clone(ro.stats.Exits)
		st.Roles[name] = rs
		st.Starts += rs.Starts
		st.Kills += rs.Kills
		st.CrashPoints += rs.CrashPoints
		for code, n := range rs.Exits {
			st.Exits[code] += n
		}
	}
	return st
}

// Stop ends every process: SIGTERM, then SIGKILL to those still running
// after StopTimeout; nothing is restarted, and Stop returns once all are
// gone. It is safe to call more than once.
func (s *Supervisor) Stop() {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		s.stopping = true
		close(s.stopped)
		var procs []*process
		for _, ro := range s.roles {
			if ro.proc != nil {
				procs = append(procs, ro.proc)
			}
		}
		s.mu.Unlock()
		for _, p := range procs {
			_ = p.signal(syscall.SIGTERM)
		}
		deadline := time.NewTimer(s.cfg.StopTimeout)
		defer deadline.Stop()
		for _, p := range procs {
			select {
			case <-p.done:
			case <-deadline.C:
				// Past the deadline every remaining process gets SIGKILL.
				for _, q := range procs {
					_ = q.signal(syscall.SIGKILL)
				}
				<-p.done
			}
		}
		for _, p := range procs {
			<-p.done
		}
		s.wg.Wait()
	})
}
