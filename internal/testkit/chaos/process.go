package chaos

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"

	"github.com/oncekit/oncekit/internal/wait"
)

// process is one OS process started by this package, its output appended to
// a log file. done closes once the process has exited and been reaped; state
// is set before that.
type process struct {
	cmd   *exec.Cmd
	done  chan struct{}
	state *os.ProcessState
}

// startProcess starts path with args and env (nil: this process's
// environment), appending its stdout and stderr to logPath. The child gets
// SIGKILL if this process dies first, so a crashed test leaves no orphans.
func startProcess(path string, args, env []string, logPath string) (*process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child holds its own copy
	cmd := exec.Command(path, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // the exit is read from ProcessState
		p.state = cmd.ProcessState
		close(p.done)
	}()
	return p, nil
}

// signal sends sig unless the process has already exited.
func (p *process) signal(sig os.Signal) error {
	if p.exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

// kill sends SIGKILL and waits until the process is gone.
func (p *process) kill() error {
	err := p.signal(syscall.SIGKILL)
	<-p.done
	return err
}

// exited reports whether the process has exited.
func (p *process) exited() bool { return wait.Closed(p.done) }

// freePorts returns n distinct TCP ports on 127.0.0.1 that were free a moment
// ago: all n listeners are open at once, so the ports differ.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
