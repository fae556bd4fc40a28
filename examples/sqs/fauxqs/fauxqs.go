// Package fauxqs starts fauxqs, an SQS emulator speaking the JSON protocol
// of the AWS SDKs, for the SQS tests: installed by
// scripts/install-fauxqs.sh at pinned versions, run as a child process on
// a free port of 127.0.0.1, stopped with the tests.
package fauxqs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
)

// Server is a running fauxqs.
type Server struct {
	// URL is its endpoint, http://127.0.0.1:port.
	URL  string
	cmd  *exec.Cmd
	done chan struct{}
}

// Client returns an SQS client on the server (static test credentials,
// region us-east-1).
func (s *Server) Client() *sqs.Client { return Client(s.URL) }

// Client returns an SQS client on endpoint.
func Client(endpoint string) *sqs.Client {
	return sqs.New(sqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
	})
}

// Stop ends the server and waits for it to exit.
func (s *Server) Stop() {
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
}

var (
	installOnce sync.Once
	installDir  string
	installErr  error
)

// Install runs scripts/install-fauxqs.sh once per process and returns the
// install directory. A test cannot run without it: outside CI it is
// skipped with the reason; in CI (CI=true) it fails.
func Install(tb testing.TB) string {
	tb.Helper()
	installOnce.Do(func() { installDir, installErr = install() })
	if installErr != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("fauxqs: %v", installErr)
		}
		tb.Skipf("fauxqs could not be installed (set CI=true to fail instead): %v", installErr)
	}
	return installDir
}

func install() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		script := filepath.Join(dir, "scripts", "install-fauxqs.sh")
		if _, err := os.Stat(script); err == nil {
			out, err := exec.Command(script).Output()
			if err != nil {
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					return "", fmt.Errorf("%s: %w: %s", script, err, strings.TrimSpace(string(ee.Stderr)))
				}
				return "", fmt.Errorf("%s: %w", script, err)
			}
			return strings.TrimSpace(string(out)), nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("scripts/install-fauxqs.sh not found above %s", wd)
		}
	}
}

// Start starts a fauxqs of its own for tb on port of 127.0.0.1 (0: a free
// one), stopped when tb ends.
func Start(tb testing.TB, port int) *Server {
	tb.Helper()
	s, err := start(Install(tb), port)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	return s
}

func start(dir string, port int) (*Server, error) {
	cmd := exec.Command(filepath.Join(dir, "node_modules", ".bin", "node"), "--no-warnings", filepath.Join(dir, "serve.mjs"))
	cmd.Env = append(os.Environ(), fmt.Sprintf("FAUXQS_PORT=%d", port))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("fauxqs: %w", err)
	}
	s := &Server{cmd: cmd, done: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "fauxqs listening on "); ok {
				select {
				case addr <- a:
				default:
				}
			}
		}
	}()
	go func() {
		_ = cmd.Wait()
		close(s.done)
	}()
	select {
	case s.URL = <-addr:
		return s, nil
	case <-s.done:
		return nil, errors.New("fauxqs exited before listening")
	case <-time.After(30 * time.Second):
		s.Stop()
		return nil, errors.New("fauxqs did not listen within 30s")
	}
}

var (
	sharedMu sync.Mutex
	shared   *Server
)

// Shared returns the fauxqs of this test process, started by its first
// caller; StopShared (from TestMain) stops it. Tests isolate their data by
// queue (NewQueue).
func Shared(tb testing.TB) *Server {
	tb.Helper()
	dir := Install(tb)
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared == nil {
		s, err := start(dir, 0)
		if err != nil {
			tb.Fatal(err)
		}
		shared = s
	}
	return shared
}

// StopShared stops the server Shared started, if any.
func StopShared() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared != nil {
		shared.Stop()
		shared = nil
	}
}

// NewQueue creates a queue named after a fresh UUID (".fifo" added for a
// FIFO queue) with attrs, deleted when tb ends, and returns its URL.
func NewQueue(tb testing.TB, client *sqs.Client, fifo bool, attrs map[string]string) string {
	tb.Helper()
	name := "q-" + uuid.NewString()
	all := map[string]string{}
	for k, v := range attrs {
		all[k] = v
	}
	if fifo {
		name += ".fifo"
		all[string(types.QueueAttributeNameFifoQueue)] = "true"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: all})
	if err != nil {
		tb.Fatalf("create queue %s: %v", name, err)
	}
	url := aws.ToString(out.QueueUrl)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = client.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(url)})
	})
	return url
}
