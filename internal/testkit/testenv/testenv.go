// Package testenv gives oncekit's tests a real PostgreSQL and a real NATS
// JetStream server, isolated per test: every call to DB makes a fresh schema
// with the migrations applied (dropped at the end), and NATS either starts an
// in-process nats-server with JetStream in a temp dir or, when NATS_URL is set,
// connects to that server (tests then isolate by stream and subject names from
// Name).
//
// DATABASE_URL overrides the default postgres://postgres@127.0.0.1:5432/postgres.
package testenv

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/redact"
	"github.com/oncekit/oncekit/migrations"
)

// DefaultDatabaseURL is used when DATABASE_URL is not set.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// DatabaseURL returns DATABASE_URL or the local default.
func DatabaseURL() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return DefaultDatabaseURL
}

var nonWord = regexp.MustCompile(`[^a-z0-9]+`)

// Name returns a short name unique to this call, safe as a schema, stream or
// subject token: the test's name, lower-cased, plus random hex.
func Name(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	base := strings.Trim(nonWord.ReplaceAllString(strings.ToLower(t.Name()), "_"), "_")
	if len(base) > 40 {
		base = base[len(base)-40:]
	}
	return "t_" + base + "_" + hex.EncodeToString(b[:])
}

// DB is a PostgreSQL pool and the fresh schema oncekit's tables live in.
type DB struct {
	Pool   *pgxpool.Pool // search_path set to Schema
	Schema string        // the test's own schema, dropped at its end
	URL    string        // DatabaseURL with search_path set to Schema (through a pooler: logged in as a role whose default it is)

	drop      func()
	closeOnce sync.Once
}

// Close drops the schema and closes the pool now, rather than when the test
// ends: for benchmarks that make several worlds in one iteration and must not
// leave the earlier ones' tables behind the later ones. It is idempotent.
func (d *DB) Close() {
	d.closeOnce.Do(func() {
		_, _ = d.Pool.Exec(context.Background(), fmt.Sprintf(`DROP SCHEMA IF EXISTS %q CASCADE`, d.Schema))
		d.Pool.Close()
		if d.drop != nil {
			d.drop()
		}
	})
}

// NewDB creates a fresh schema, applies every migration in it and returns a
// pool whose search_path is that schema (so a test's own tables land there
// too). The schema is dropped when the test ends.
func NewDB(t testing.TB) *DB {
	t.Helper()
	return NewDBAt(t, 0)
}

// NewDBAt is NewDB with the migrations applied up to version only (0: all),
// for tests of an upgrade.
func NewDBAt(t testing.TB, version int) *DB {
	t.Helper()
	return newDB(t, DatabaseURL(), version)
}

// NewDBOn is NewDB on the server and database of url (a throwaway
// cluster's, say) instead of DatabaseURL.
func NewDBOn(t testing.TB, url string) *DB {
	t.Helper()
	return newDB(t, url, 0)
}

func newDB(t testing.TB, url string, version int) *DB {
	t.Helper()
	ctx := context.Background()
	schema := Name(t)
	var drop func()
	if Pooled(t, url) {
		// No start-up parameter and no session state pass a transaction
		// pooler: the test logs in as a role of its own whose default
		// search_path is its schema.
		url, drop = pooledRole(t, url, schema)
	}
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	if drop == nil {
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
	}
	if cfg.MaxConns < 8 {
		cfg.MaxConns = 8
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	_, err = migrations.Up(ctx, pool, migrations.WithSchema(schema), migrations.WithTarget(version))
	require.NoError(t, err, "migrations on %s (is PostgreSQL up?)", url)
	db := &DB{Pool: pool, Schema: schema, URL: url, drop: drop}
	if drop == nil {
		db.URL = withSearchPath(url, schema)
	}
	t.Cleanup(db.Close)
	return db
}

func withSearchPath(url, schema string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "search_path=" + schema
}

var (
	pooledMu    sync.Mutex
	pooledCache = map[string]bool{}
)

// Pooled reports whether url reaches PostgreSQL through a connection
// pooler (PgBouncer in transaction mode, for the pooled test leg), found
// once per URL by pgsql.Direct.
func Pooled(t testing.TB, url string) bool {
	t.Helper()
	pooledMu.Lock()
	defer pooledMu.Unlock()
	if p, ok := pooledCache[url]; ok {
		return p
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err, "connect to %s (is PostgreSQL up?)", redact.String(url))
	defer func() { _ = conn.Close(ctx) }()
	direct, err := pgsql.Direct(ctx, conn)
	require.NoError(t, err)
	pooledCache[url] = !direct
	return !direct
}

// RequireDirect skips the test when DATABASE_URL goes through a connection
// pooler, saying why the test needs a session of its own (the pooled leg
// lists the tests it left out and why).
func RequireDirect(t testing.TB, why string) {
	t.Helper()
	if Pooled(t, DatabaseURL()) {
		t.Skipf("needs a direct connection to PostgreSQL: %s", why)
	}
}

// pooledRole creates a login role named schema whose default search_path
// is schema, and returns url logged in as it, and what drops the role and
// everything it owns.
func pooledRole(t testing.TB, url, schema string) (string, func()) {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer func() { _ = admin.Close(ctx) }()
	role := pgx.Identifier{schema}.Sanitize()
	_, err = admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN SUPERUSER")
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "ALTER ROLE "+role+" SET search_path = "+role)
	require.NoError(t, err)
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	u, err := neturl.Parse(url)
	require.NoError(t, err, "DATABASE_URL must be a URL in the pooled leg")
	u.User = neturl.User(schema)
	drop := func() {
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return
		}
		defer func() { _ = c.Close(ctx) }()
		// The pooler keeps the role's server connections: end them first.
		_, _ = c.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", schema)
		_, _ = c.Exec(ctx, "DROP OWNED BY "+role+" CASCADE")
		_, _ = c.Exec(ctx, "DROP ROLE "+role)
	}
	return u.String(), drop
}

// NATS is a connection to a real JetStream-enabled server.
type NATS struct {
	URL    string              // the server's client URL
	Conn   *nats.Conn          // a connection, closed at the test's end
	JS     jetstream.JetStream // JetStream on Conn
	Server *server.Server      // nil when NATS_URL points elsewhere
}

// Close closes the connection and shuts the in-process server down (if
// any) now, rather than when the test ends. It is idempotent.
func (n *NATS) Close() {
	n.Conn.Close()
	if n.Server != nil {
		n.Server.Shutdown()
		n.Server.WaitForShutdown()
	}
}

// NewNATS connects to NATS_URL when set, else starts an in-process
// nats-server with JetStream storing in a temp dir. Everything is closed when
// the test ends.
func NewNATS(t testing.TB) *NATS {
	t.Helper()
	if u := os.Getenv("NATS_URL"); u != "" {
		return connect(t, &NATS{URL: u})
	}
	srv := StartServer(t, t.TempDir(), -1)
	return connect(t, &NATS{URL: srv.ClientURL(), Server: srv})
}

func connect(t testing.TB, n *NATS) *NATS {
	t.Helper()
	nc, err := nats.Connect(n.URL, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	n.Conn, n.JS = nc, js
	return n
}

// StartServer starts an in-process nats-server with JetStream storing in dir,
// on port (-1 picks a free one). Starting it again on the same dir and port
// is how tests restart the broker with its data. It is shut down when the test
// ends, if still running.
func StartServer(t testing.TB, dir string, port int) *server.Server {
	t.Helper()
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      port,
		JetStream: true,
		StoreDir:  dir,
		NoLog:     true,
		NoSigs:    true,
	}
	srv, err := server.NewServer(opts)
	require.NoError(t, err)
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("testenv: nats-server did not start")
	}
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	return srv
}

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// OncekitBinary builds ./cmd/oncekit once per test process and returns the
// binary's path, for tests that run (and kill) real oncekit daemons.
func OncekitBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			buildErr = err
			return
		}
		// One directory per checkout, reused across runs, so that test runs
		// leave nothing behind; each process builds to a temp name and renames
		// it into place (atomic, and harmless to a binary another package's
		// tests are running).
		sum := sha256.Sum256([]byte(root))
		dir := filepath.Join(os.TempDir(), "oncekit-testbin-"+hex.EncodeToString(sum[:6]))
		if buildErr = os.MkdirAll(dir, 0o755); buildErr != nil {
			return
		}
		tmp := filepath.Join(dir, fmt.Sprintf("build-%d", os.Getpid()))
		cmd := exec.Command("go", "build", "-o", tmp, ".")
		cmd.Dir = filepath.Join(root, "cmd", "oncekit") // a module of its own
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/oncekit: %v\n%s", err, out)
			return
		}
		buildPath = filepath.Join(dir, "oncekit")
		buildErr = os.Rename(tmp, buildPath)
	})
	require.NoError(t, buildErr)
	return buildPath
}

// moduleRoot finds the directory holding oncekit's go.mod.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/oncekit/oncekit").Output()
	if err != nil {
		return "", fmt.Errorf("testenv: locate module: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}
