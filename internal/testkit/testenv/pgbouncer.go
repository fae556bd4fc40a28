package testenv

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PgBouncerINI is the configuration the tests run PgBouncer with: transaction
// pooling, and every pooling setting at its default. Only what a test bed
// needs is set: where to listen, where to log, and trust authentication that
// looks each role up in PostgreSQL (auth_user, auth_query's default), so
// that the roles tests create log in without an auth_file entry each.
const PgBouncerINI = `[databases]
* = host=%s port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
pool_mode = transaction
auth_type = trust
auth_file = %s
auth_user = %s
logfile = %s
pidfile = %s
`

// PgBouncer is a PgBouncer process in front of the test PostgreSQL.
type PgBouncer struct {
	// URL reaches PostgreSQL through the pooler, as the user of upstream,
	// with pgx's default_query_exec_mode=exec (PgBouncer 1.18 tracks no
	// prepared statements).
	URL string
	// Dir holds the configuration, the log and the pid file.
	Dir string
}

// StartPgBouncer starts a PgBouncer (Debian's pgbouncer package) on a free
// port in front of upstream's server, in transaction pooling mode, and
// stops it when the test ends. It fails the test, never skips it, when
// pgbouncer is not installed: `apt-get install pgbouncer` (.ci/run does).
func StartPgBouncer(t testing.TB, upstream string) *PgBouncer {
	t.Helper()
	return startPgBouncer(t, upstream, 3)
}

// startPgBouncer is StartPgBouncer, trying again on another port, up to
// attempts times in all, when the free port it picked was taken before
// PgBouncer could listen on it.
func startPgBouncer(t testing.TB, upstream string, attempts int) *PgBouncer {
	t.Helper()
	cfg, err := pgx.ParseConfig(upstream)
	if err != nil {
		t.Fatalf("testenv: pgbouncer upstream: %v", err)
	}
	dir, err := os.MkdirTemp("", "oncekit-pgbouncer-")
	if err != nil {
		t.Fatalf("testenv: pgbouncer dir: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	_, port, _ := net.SplitHostPort(FreeAddr(t))
	p, _ := strconv.Atoi(port)
	cmd, err := PgBouncerCommand(dir, cfg.Host, int(cfg.Port), p, cfg.User, false)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	logf, err := os.Create(filepath.Join(dir, "stderr.log"))
	if err != nil {
		t.Fatalf("testenv: pgbouncer log: %v", err)
	}
	defer logf.Close()
	out := func() string { b, _ := os.ReadFile(logf.Name()); return string(b) }
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: runuser passes no signal on.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("testenv: start pgbouncer: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		// SIGTERM: PgBouncer's immediate shutdown (SIGINT waits for clients).
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	addr := net.JoinHostPort("127.0.0.1", port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			select {
			case <-done:
				// What answered was another process that took the free
				// port first (a server of a test running beside this
				// one): PgBouncer could not listen and exited.
				if attempts > 1 {
					return startPgBouncer(t, upstream, attempts-1)
				}
				t.Fatalf("testenv: pgbouncer exited at start, %s answering in its place:\n%s", addr, out())
			case <-time.After(100 * time.Millisecond):
			}
			break
		}
		select {
		case <-done:
			if strings.Contains(out(), "Address already in use") && attempts > 1 {
				return startPgBouncer(t, upstream, attempts-1) // the free port was taken meanwhile
			}
			t.Fatalf("testenv: pgbouncer exited at start:\n%s", out())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: pgbouncer did not listen on %s:\n%s", addr, out())
		}
		time.Sleep(20 * time.Millisecond) // polling a port with a deadline
	}
	u := url.URL{Scheme: "postgres", User: url.User(cfg.User), Host: addr, Path: "/" + cfg.Database}
	u.RawQuery = "sslmode=disable&default_query_exec_mode=exec"
	return &PgBouncer{URL: u.String(), Dir: dir}
}

// PgBouncerCommand writes PgBouncerINI into dir for a server at host:port
// and returns the command that runs pgbouncer on listen (as the postgres
// user when run as root, which pgbouncer refuses); daemon adds -d.
func PgBouncerCommand(dir, host string, port, listen int, authUser string, daemon bool) (*exec.Cmd, error) {
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer"} {
			if _, serr := os.Stat(p); serr == nil {
				bin, err = p, nil
				break
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("pgbouncer is not installed: apt-get install pgbouncer (.ci/run does)")
	}
	if strings.HasPrefix(host, "/") {
		host = "127.0.0.1"
	}
	auth := filepath.Join(dir, "userlist.txt")
	ini := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(auth, []byte(strconv.Quote(authUser)+` ""`+"\n"), 0o644); err != nil {
		return nil, err
	}
	conf := fmt.Sprintf(PgBouncerINI, host, port, listen, auth, authUser,
		filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
	if err := os.WriteFile(ini, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	args := []string{ini}
	if daemon {
		args = []string{"-d", ini}
	}
	if os.Geteuid() != 0 {
		return exec.Command(bin, args...), nil
	}
	// pgbouncer will not run as root: hand the directory to postgres.
	pg, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgbouncer refuses root and there is no postgres user: %w", err)
	}
	uid, _ := strconv.Atoi(pg.Uid)
	gid, _ := strconv.Atoi(pg.Gid)
	for _, f := range []string{dir, auth, ini} {
		if err := os.Chown(f, uid, gid); err != nil {
			return nil, err
		}
	}
	return exec.Command("runuser", append([]string{"-u", "postgres", "--", bin}, args...)...), nil
}

// PooledURL returns a URL that reaches the test PostgreSQL through PgBouncer
// in transaction pooling mode, with pgx's default_query_exec_mode set to
// mode (exec or cache_describe: the two that need no prepared statement on
// the server): DATABASE_URL itself when it goes through a pooler already
// (the pooled test leg), else a PgBouncer started for the test.
func PooledURL(t testing.TB, mode string) string {
	t.Helper()
	base := DatabaseURL()
	if !Pooled(t, base) {
		base = StartPgBouncer(t, base).URL
	}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("testenv: pooled URL: %v", err)
	}
	q := u.Query()
	q.Set("default_query_exec_mode", mode)
	u.RawQuery = q.Encode()
	return u.String()
}

// PooledModes are pgx's query execution modes that work through a
// transaction pooler that keeps no prepared statements (PgBouncer before
// 1.21, or with max_prepared_statements = 0).
var PooledModes = []string{"exec", "cache_describe"}
