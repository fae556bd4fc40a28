package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/internal/wait"
)

// Poolers are the connection poolers a run can put between the daemons and
// PostgreSQL (Options.Pooler): none, or PgBouncer in transaction mode.
var Poolers = []string{"none", "pgbouncer"}

// PgBouncer is a PgBouncer process of a chaos run: pool_mode = transaction,
// every pooling setting at its default (testenv.PgBouncerINI), in front of
// the run's PGProxy. The proxy's cuts and PostgreSQL's crashes then hit
// PgBouncer's server connections, as a network fault or a crashed server
// would in production: PgBouncer must answer a client whose server
// connection died mid-transaction with an error (a COMMIT's outcome
// unknown), never hand it a server connection in another state, and
// connect again once PostgreSQL is back.
//
// The run's connection counts fit the defaults: eight processes reach
// PostgreSQL through it, each pool at most 12 connections (the payments
// example's MaxConns), 96 clients under max_client_conn's 100; the polling
// relay opens no LISTEN connection through it (it detects the pooler and
// polls). default_pool_size (20 server connections) queues the rest, as it
// would in production.
//
// PgBouncer 1.18 can crash under these faults (an assertion, "bad client
// state", after a client's cancel request meets a server connection that
// died): the run restarts it on its address, as systemd's Restart= would,
// and counts the restarts (Restarts).
type PgBouncer struct {
	addr string
	dir  string
	path string // the command, to start it again
	args []string
	env  []string

	mu       sync.Mutex
	done     chan struct{} // closed when the current process ends
	pgid     int
	closing  bool
	ended    chan struct{} // closed when no process will run again
	restarts atomic.Int64
}

// StartPgBouncer starts PgBouncer on a free port of 127.0.0.1 in front of
// upstream (host:port), its configuration and log in dir, and waits until
// it accepts connections. It runs as the postgres user when this process
// is root (PgBouncer refuses root).
func StartPgBouncer(ctx context.Context, dir, upstream string) (*PgBouncer, error) {
	host, port, err := net.SplitHostPort(upstream)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer upstream: %w", err)
	}
	upPort, err := strconv.Atoi(port)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer upstream: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	cmd, err := testenv.PgBouncerCommand(dir, host, upPort, ports[0], "postgres", false)
	if err != nil {
		return nil, err
	}
	// Not a pooling setting: lets the run read SHOW POOLS (Pools).
	if err := appendFile(filepath.Join(dir, "pgbouncer.ini"), "stats_users = postgres\n"); err != nil {
		return nil, err
	}
	b := &PgBouncer{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])), dir: dir,
		path: cmd.Path, args: cmd.Args[1:], env: cmd.Env, ended: make(chan struct{})}
	if err := b.start(ctx); err != nil {
		b.Close()
		return nil, err
	}
	go b.supervise(ctx)
	return b, nil
}

// start starts the process and waits until it accepts connections.
func (b *PgBouncer) start(ctx context.Context) error {
	cmd := exec.Command(b.path, b.args...)
	cmd.Env = b.env
	logf, err := os.OpenFile(filepath.Join(b.dir, "stderr.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	// A process group of its own, ended as a whole: as root the command is
	// runuser, which passes no signal on to pgbouncer.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start pgbouncer: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	b.mu.Lock()
	if b.closing { // closed while it was starting
		b.mu.Unlock()
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return errExited
	}
	b.done, b.pgid = done, cmd.Process.Pid
	b.mu.Unlock()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	go func() { // a process that ends stops the wait
		select {
		case <-done:
			cancel()
		case <-sctx.Done():
		}
	}()
	err = poll(sctx, func(ctx context.Context) error {
		if wait.Closed(done) {
			return errExited
		}
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", b.addr)
		if err == nil {
			_ = c.Close()
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("pgbouncer did not start (logs in %s): %w", b.dir, err)
	}
	return nil
}

// supervise starts PgBouncer again each time it dies, until Close.
func (b *PgBouncer) supervise(ctx context.Context) {
	defer close(b.ended)
	for {
		b.mu.Lock()
		done := b.done
		b.mu.Unlock()
		<-done
		b.mu.Lock()
		closing := b.closing
		b.mu.Unlock()
		if closing || !wait.Sleep(ctx, time.Second) {
			return
		}
		b.restarts.Add(1)
		// A killed PgBouncer leaves its pid file, which makes the next
		// refuse to start.
		_ = os.Remove(filepath.Join(b.dir, "pgbouncer.pid"))
		if err := b.start(ctx); err != nil {
			return
		}
	}
}

// Restarts returns how many times PgBouncer died and was started again.
func (b *PgBouncer) Restarts() int { return int(b.restarts.Load()) }

var errExited = errors.New("exited")

// URL returns direct, a URL of the upstream server, with its host and port
// replaced by PgBouncer's and pgx's default_query_exec_mode set to mode
// (exec or cache_describe: the modes that need no prepared statement kept
// on a server connection).
func (b *PgBouncer) URL(direct, mode string) (string, error) {
	u, err := url.Parse(direct)
	if err != nil {
		return "", fmt.Errorf("pooled url: %w", err)
	}
	u.Host = b.addr
	q := u.Query()
	q.Set("default_query_exec_mode", mode)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// Addr returns where clients connect, host:port.
func (b *PgBouncer) Addr() string { return b.addr }

// Dir returns the directory of its configuration and log.
func (b *PgBouncer) Dir() string { return b.dir }

// Exited reports whether PgBouncer has ended for good: closed, or dead
// and not started again.
func (b *PgBouncer) Exited() bool { return wait.Closed(b.ended) }

// Close ends PgBouncer: SIGTERM (its immediate shutdown), SIGKILL after 10 s.
func (b *PgBouncer) Close() {
	b.mu.Lock()
	b.closing = true
	done, pgid := b.done, b.pgid
	b.mu.Unlock()
	if done == nil {
		return
	}
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-done
	}
}

// Pools reads the pool's state from PgBouncer's console (SHOW POOLS):
// clients active and waiting for a server connection, the longest wait,
// server connections active, idle and logging in. It returns the error's
// text when the console does not answer.
func (b *PgBouncer) Pools(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, "postgres://postgres@"+b.addr+"/pgbouncer?sslmode=disable&default_query_exec_mode=simple_protocol")
	if err != nil {
		return "console: " + err.Error()
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, "SHOW POOLS")
	if err != nil {
		return "console: " + err.Error()
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return "console: " + err.Error()
		}
		row := map[string]string{}
		for i, f := range rows.FieldDescriptions() {
			row[f.Name] = fmt.Sprint(vals[i])
		}
		if row["database"] == "pgbouncer" {
			continue
		}
		out = append(out, fmt.Sprintf("%s: cl_active=%s cl_waiting=%s maxwait=%ss sv_active=%s sv_idle=%s sv_used=%s sv_login=%s",
			row["database"], row["cl_active"], row["cl_waiting"], row["maxwait"], row["sv_active"], row["sv_idle"], row["sv_used"], row["sv_login"]))
	}
	if err := rows.Err(); err != nil {
		return "console: " + err.Error()
	}
	return strings.Join(out, "; ")
}

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// waitServing waits until a client reaches PostgreSQL through b again
// (PgBouncer reconnects to a restarted server by itself), or ctx ends.
func (b *PgBouncer) waitServing(ctx context.Context, direct string) error {
	if b.Exited() {
		return fmt.Errorf("pgbouncer exited during the run (log in %s)", b.dir)
	}
	u, err := b.URL(direct, "exec")
	if err != nil {
		return err
	}
	if err := poll(ctx, func(ctx context.Context) error { return checkPooled(ctx, u) }); err != nil {
		return fmt.Errorf("pgbouncer does not serve again: %w", err)
	}
	return nil
}

// checkPooled connects to url and requires a pooler on the way: the
// backend's process ID is not the one announced at start-up
// (pgsql.Direct), so the daemons really go through PgBouncer.
func checkPooled(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("through pgbouncer: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	direct, err := pgsql.Direct(ctx, conn)
	if err != nil {
		return fmt.Errorf("through pgbouncer: %w", err)
	}
	if direct {
		return errors.New("through pgbouncer: the connection has a backend of its own: no pooler on the way")
	}
	return nil
}

// pooledMode is the query execution mode of the named process through a
// pooler: each role's first process uses exec, its second cache_describe,
// so that both modes run every statement of every role.
func pooledMode(name string) string {
	if strings.HasSuffix(name, "-2") {
		return "cache_describe"
	}
	return "exec"
}

// roleURLs returns each process's DATABASE_URL: proxied without a pooler;
// through b, in the process's pooledMode, with one. The logical relay's
// replication stream and session lease need a session of their own (it
// refuses a pooler): with relay "logical" the relays keep proxied.
func roleURLs(ctx context.Context, b *PgBouncer, direct, proxied, relay string, names []string) (map[string]string, error) {
	urls := make(map[string]string, len(names))
	for _, name := range names {
		urls[name] = proxied
		if b == nil || (relay == "logical" && roleOf(name) == "relay") {
			continue
		}
		u, err := b.URL(direct, pooledMode(name))
		if err != nil {
			return nil, err
		}
		urls[name] = u
	}
	for _, mode := range []string{"exec", "cache_describe"} {
		if b == nil {
			break
		}
		u, err := b.URL(direct, mode)
		if err != nil {
			return nil, err
		}
		if err := checkPooled(ctx, u); err != nil {
			return nil, err
		}
	}
	return urls, nil
}
