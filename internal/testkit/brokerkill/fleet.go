package brokerkill

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/oncekit/oncekit/internal/crashpoint"
	"github.com/oncekit/oncekit/internal/wait"
)

// relayCrash is the relay's crash point between publish and mark.
const relayCrash = "relay.after-publish"

// errHelper is a helper process that exited otherwise than by SIGKILL or
// a SIGTERM of the run.
var errHelper = errors.New("brokerkill: a helper process failed")

// proc is one helper process.
type proc struct {
	role, log string
	cmd       *exec.Cmd
	done      chan struct{}
}

// signal sends sig unless the process has exited, and waits for its exit.
func (p *proc) signal(sig syscall.Signal) {
	if !wait.Closed(p.done) {
		_ = p.cmd.Process.Signal(sig)
	}
	<-p.done
}

// fleet is the run's helper processes.
type fleet struct {
	cfg       Config
	sum       *Summary
	n         int
	relays    []*proc
	consumers []*proc
	extra     *proc // a consumer that joins, then leaves
}

// start starts a helper; armed, if not empty, is the crash point it
// SIGKILLs itself at, on its after-th hit.
func (f *fleet) start(role, armed string, after int) (*proc, error) {
	f.n++
	cmd := f.cfg.Command()
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, EnvRole+"="+role, EnvDB+"="+f.cfg.URL, EnvSchema+"="+f.cfg.Schema)
	if armed != "" {
		cmd.Env = append(cmd.Env, crashpoint.EnvVar+"="+armed, crashpoint.EnvAfter+"="+strconv.Itoa(after))
	}
	p := &proc{role: role, log: filepath.Join(f.cfg.LogDir, role+"-"+strconv.Itoa(f.n)+".log"), cmd: cmd, done: make(chan struct{})}
	logf, err := os.Create(p.log)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child holds its own copy
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("brokerkill: start %s: %w", role, err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

// kill SIGKILLs ps[i] and starts its replacement, armed or not.
func (f *fleet) kill(ps []*proc, i int, role, armed string, after int) error {
	ps[i].signal(syscall.SIGKILL)
	f.count(role)
	var err error
	ps[i], err = f.start(role, armed, after)
	return err
}

func (f *fleet) count(role string) {
	if role == "relay" {
		f.sum.RelayKills++
	} else {
		f.sum.ConsumerKills++
	}
}

// sweep restarts the helpers that killed themselves at their crash point;
// a helper that exited any other way fails the run.
func (f *fleet) sweep() error {
	for _, ps := range [][]*proc{f.relays, f.consumers} {
		for i, p := range ps {
			if !wait.Closed(p.done) {
				continue
			}
			ws, _ := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
			if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				out, _ := os.ReadFile(p.log)
				return fmt.Errorf("%w: %s exited with %v:\n%s", errHelper, p.role, p.cmd.ProcessState, tail(out))
			}
			f.count(p.role)
			f.sum.AtCrashPoints++
			var err error
			if ps[i], err = f.start(p.role, "", 0); err != nil {
				return err
			}
		}
	}
	return nil
}

// stop signals every helper and waits for them.
func (f *fleet) stop(sig syscall.Signal) {
	for _, p := range append(append(f.relays, f.consumers...), f.extra) {
		if p != nil {
			p.signal(sig)
		}
	}
}

func tail(b []byte) []byte {
	if len(b) > 2000 {
		return b[len(b)-2000:]
	}
	return b
}
