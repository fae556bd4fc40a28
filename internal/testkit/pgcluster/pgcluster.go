package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/wait"
)

// PGBinEnv names an environment variable that, when set, is the directory
// holding initdb and pg_ctl. Otherwise the newest /usr/lib/postgresql/*/bin
// is used, then PATH.
const PGBinEnv = "ONCEKIT_PG_BIN"

// ErrNoPostgres is returned by StartPG when initdb and pg_ctl cannot be found.
var ErrNoPostgres = errors.New("pgcluster: PostgreSQL server binaries (initdb, pg_ctl) not found")

// startTimeout bounds New and Start when ctx has no earlier deadline.
const startTimeout = 2 * time.Minute

// Cluster is a throwaway PostgreSQL cluster: initdb into a fresh directory,
// trust authentication, listening only on 127.0.0.1 at its own port, unix
// sockets in the data directory, and the caller's settings.
//
// The data directory lives in its own temp directory (mode 0755, data owned
// by the postgres user) rather than under the caller's directory, because the
// server runs as postgres and must be able to reach it, which a 0700 test
// temp dir forbids; Close removes it. The server log is appended to
// postgres.log in the caller's directory (the file is opened by this process
// and inherited by the server, so postgres needs no access to that
// directory).
//
// When this process runs as root, initdb and pg_ctl run as the postgres user
// through `runuser -u postgres --` (both refuse root); otherwise they run as
// the current user.
type Cluster struct {
	bin     string
	base    string
	data    string
	logPath string
	port    int

	closeOnce sync.Once
	keep      atomic.Bool // Close leaves the data directory
}

// Keep makes Close leave the data directory for a post-mortem, and returns
// its path.
func (p *Cluster) Keep() string {
	p.keep.Store(true)
	return p.data
}

// Options are a Cluster's log directory and server settings.
type Options struct {
	// LogDir receives the server log, postgres.log.
	LogDir string
	// Settings are postgresql.conf lines, appended after the listening
	// address, port and socket directory.
	Settings string
}

// Start creates and starts a PostgreSQL cluster and waits until it accepts
// connections. On error nothing is left running or on disk but the log.
func Start(ctx context.Context, opt Options) (*Cluster, error) {
	bin, err := pgBinDir()
	if err != nil {
		return nil, err
	}
	return StartIn(ctx, bin, opt)
}

// create runs initdb and writes the server settings.
func (p *Cluster) create(ctx context.Context, settings string) error {
	if err := os.Chmod(p.base, 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(p.data, 0o700); err != nil {
		return err
	}
	if os.Geteuid() == 0 {
		if err := chownToPostgres(p.data); err != nil {
			return err
		}
	}
	// --no-sync: a throwaway cluster does not outlive the machine's page
	// cache; the server syncs as its settings say.
	if err := p.run(ctx, "initdb", "-D", p.data, "-U", "postgres", "--auth=trust",
		"--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions"); err != nil {
		return err
	}
	conf := fmt.Sprintf(`
# oncekit throwaway cluster
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = '%s'
logging_collector = off
log_line_prefix = '%%m [%%p] '
%s
`, p.port, p.data, settings)
	f, err := os.OpenFile(filepath.Join(p.data, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(conf); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// chownToPostgres gives dir to the postgres user.
func chownToPostgres(dir string) error {
	u, err := user.Lookup("postgres")
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return os.Chown(dir, uid, gid)
}

// pickPort picks a new cluster's port: freePort, or a test's choice.
var pickPort = freePort

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgcluster: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// pgBinDir finds the directory holding initdb and pg_ctl.
func pgBinDir() (string, error) {
	if d := os.Getenv(PGBinEnv); d != "" {
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) > pgMajor(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", ErrNoPostgres
}

// pgMajor reads the version number out of /usr/lib/postgresql/<major>/bin.
func pgMajor(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// run runs one of the server tools as the postgres user, its output appended
// to the server log (the server started by pg_ctl inherits that file).
func (p *Cluster) run(ctx context.Context, tool string, args ...string) error {
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	path := filepath.Join(p.bin, tool)
	cmd := exec.CommandContext(ctx, path, args...)
	if os.Geteuid() == 0 {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	}
	cmd.Dir = p.base // a directory postgres can read
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pgcluster: %s %v: %w (see %s)", tool, args, err, p.logPath)
	}
	return nil
}

// URL returns a connection URL for database db on this cluster.
func (p *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", p.port, db)
}

// Addr returns the server's host:port, the target for a PGProxy.
func (p *Cluster) Addr() string { return fmt.Sprintf("127.0.0.1:%d", p.port) }

// LogPath returns the server log's path.
func (p *Cluster) LogPath() string { return p.logPath }

// CreateDB creates database name.
func (p *Cluster) CreateDB(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	return err
}

// StopImmediate stops the server with `pg_ctl stop -m immediate`: every
// backend quits at once without a checkpoint, as in a crash, and the next
// Start runs crash recovery from the WAL.
func (p *Cluster) StopImmediate() error {
	return p.run(context.Background(), "pg_ctl", "-D", p.data, "-m", "immediate", "-w", "stop")
}

// SetXIDEpoch stops the server cleanly, sets the epoch of its transaction
// IDs with pg_resetwal -e (the xid8 values it hands out then start at
// epoch << 32: a cluster that has run for years) and starts it again.
func (p *Cluster) SetXIDEpoch(ctx context.Context, epoch uint32) error {
	if err := p.run(ctx, "pg_ctl", "-D", p.data, "-m", "fast", "-w", "stop"); err != nil {
		return err
	}
	if err := p.run(ctx, "pg_resetwal", "-e", strconv.FormatUint(uint64(epoch), 10), p.data); err != nil {
		return err
	}
	return p.Start(ctx)
}

// Tool returns the path of one of the server's client programs, such as
// pg_dump or pg_restore, of the cluster's version.
func (p *Cluster) Tool(name string) string { return filepath.Join(p.bin, name) }

// Start starts the server (after StopImmediate: through crash recovery) and
// waits until it accepts connections.
func (p *Cluster) Start(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if err := p.run(ctx, "pg_ctl", "-D", p.data, "-w", "-t", "120", "start"); err != nil {
		return err
	}
	return wait.Until(ctx, 50*time.Millisecond, func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, p.URL("postgres"))
		if err != nil {
			return err
		}
		return conn.Close(ctx)
	})
}

// firstStart starts a new cluster's server. The port was free when it was
// picked, but another process may have bound it since (initdb takes
// seconds): the server then fails to listen, and firstStart picks another
// port and tries again, a few times.
func (p *Cluster) firstStart(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		from := logSize(p.logPath)
		err := p.Start(ctx)
		if err == nil || attempt == 5 || !portTaken(p.logPath, from) {
			return err
		}
		port, perr := freePort()
		if perr != nil {
			return errors.Join(err, perr)
		}
		if werr := appendConf(p.data, fmt.Sprintf("\n# the port above was taken\nport = %d\n", port)); werr != nil {
			return errors.Join(err, werr)
		}
		p.port = port
	}
}

func logSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// portTaken reports whether the log, from byte from on, says the server
// could not bind its address.
func portTaken(path string, from int64) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return false
	}
	b, _ := io.ReadAll(io.LimitReader(f, 1<<20))
	return bytes.Contains(b, []byte("Address already in use"))
}

// appendConf appends lines to dir's postgresql.conf (later lines win).
func appendConf(dir, lines string) error {
	f, err := os.OpenFile(filepath.Join(dir, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(lines); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Close stops the server at once and removes its data directory. It is safe
// to call more than once and after a failed start.
func (p *Cluster) Close() {
	p.closeOnce.Do(func() {
		if _, err := os.Stat(filepath.Join(p.data, "postmaster.pid")); err == nil {
			_ = p.StopImmediate()
		}
		if !p.keep.Load() {
			_ = os.RemoveAll(p.base)
		}
	})
}
