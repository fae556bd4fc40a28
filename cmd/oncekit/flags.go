package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/oncekit/oncekit"
)

// newFlagSet returns a flag set that reports errors instead of exiting and
// prints nothing by itself: parse prints the usage on -h, and run prints
// errors once.
func newFlagSet(e *env, name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet("oncekit "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "usage: oncekit %s\n\nflags:\n", usage)
		fs.SetOutput(e.stderr)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return fs
}

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool {
	switch arg {
	case "-h", "-help", "--help", "help":
		return true
	}
	return false
}

// parse parses args, turning -h into the usage and a clean exit, and other
// errors into usage errors (reported once, by run).
func parse(fs *flag.FlagSet, args []string) error {
	usage := fs.Usage
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.Usage = usage
	if errors.Is(err, flag.ErrHelp) {
		usage()
		return &exitError{code: 0}
	}
	if err != nil {
		return usagef("%v (run `%s -h` for the flags)", err, fs.Name())
	}
	return nil
}

// parseSubcommand returns args' first word, the subcommand, and parses the
// rest into fs. No subcommand is a usage error listing subs; a help word
// prints the usage and exits cleanly.
func parseSubcommand(fs *flag.FlagSet, args []string, subs string) (string, error) {
	if len(args) == 0 {
		fs.Usage()
		return "", usagef("missing subcommand: %s", subs)
	}
	sub := args[0]
	if isHelp(sub) {
		fs.Usage()
		return "", &exitError{code: 0}
	}
	return sub, parse(fs, args[1:])
}

// nonNegative fails with a usage error naming the first negative duration
// flag among names.
func nonNegative(fs *flag.FlagSet, names ...string) error {
	for _, n := range names {
		if d, ok := fs.Lookup(n).Value.(flag.Getter).Get().(time.Duration); ok && d < 0 {
			return usagef("--%s: %s is negative", n, d)
		}
	}
	return nil
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// envString is a string flag whose default comes from an environment
// variable read after parsing, so that -h never prints a value taken from
// the environment (a credential, often).
type envString struct {
	value string
	set   bool
}

func (s *envString) String() string     { return "" }
func (s *envString) Set(v string) error { s.value, s.set = v, true; return nil }

// resolve returns the flag's value when given, else the variable's, else def.
func (s *envString) resolve(e *env, variable, def string) string {
	if s.set {
		return s.value
	}
	if v := e.getenv(variable); v != "" {
		return v
	}
	return def
}

// dbFlags are the flags of every command that talks to PostgreSQL.
type dbFlags struct {
	urlFlag, schemaFlag envString
	e                   *env
	// maxConns, when positive, sizes the pool unless the URL's
	// pool_max_conns does.
	maxConns int
	// standbyOK lets a command that only reads (status, drift) run on a
	// read-only standby; every other command refuses one.
	standbyOK bool
}

func (d *dbFlags) register(fs *flag.FlagSet, e *env) {
	d.e = e
	fs.Var(&d.urlFlag, "database-url", "PostgreSQL connection `URL` (default: env DATABASE_URL)")
	fs.Var(&d.schemaFlag, "schema", "`NAME` of the schema of oncekit's tables (default: env ONCEKIT_SCHEMA, else "+oncekit.DefaultSchema+")")
}

// url is the connection string: the flag's, else DATABASE_URL.
func (d *dbFlags) url() string { return d.urlFlag.resolve(d.e, "DATABASE_URL", "") }

// schema is the schema of oncekit's tables: the flag's, else
// ONCEKIT_SCHEMA, else the default.
func (d *dbFlags) schema() string {
	return d.schemaFlag.resolve(d.e, "ONCEKIT_SCHEMA", oncekit.DefaultSchema)
}

// validate checks the schema name (no SQL through configuration).
func (d *dbFlags) validate() error {
	if d.schema() == "" {
		return usagef("--schema: must not be empty")
	}
	if _, err := oncekit.ValidateSchema(d.schema()); err != nil {
		return usagef("--schema: %v", err)
	}
	return nil
}

// errNoTables is wrapped by open's error when the migrations were not run.
var errNoTables = errors.New("oncekit's tables are missing")

// open validates the flags and connects, failing fast with a message that
// names the problem: PostgreSQL unreachable, the database or role missing,
// the login refused, or (unless the command creates them) oncekit's tables
// missing from the schema.
func (d *dbFlags) open(ctx context.Context) (*pgxpool.Pool, error) {
	return d.openWith(ctx, true)
}

// openWith is open; needTables false skips the tables check (migrate).
func (d *dbFlags) openWith(ctx context.Context, needTables bool) (*pgxpool.Pool, error) {
	if err := d.validate(); err != nil {
		return nil, err
	}
	if d.url() == "" {
		return nil, usagef("--database-url (or DATABASE_URL) is required")
	}
	if err := checkURL(d.url()); err != nil {
		return nil, usagef("--database-url: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(d.url())
	if err != nil {
		return nil, usagef("--database-url: %v", err)
	}
	if d.maxConns > 0 && !strings.Contains(d.url(), "pool_max_conns") {
		cfg.MaxConns = int32(d.maxConns)
	}
	// oncekit's statements are short and indexed; JIT compilation only adds
	// hundreds of milliseconds of CPU where a large table's estimates pass
	// jit_above_cost. A jit setting in the URL wins. It is not a start-up
	// parameter, which a pooler refuses (PgBouncer: "unsupported startup
	// parameter"), nor a session's setting through a pooler, where the next
	// transaction runs on another server connection: the connection turns
	// it off only when it has a backend of its own.
	if _, set := cfg.ConnConfig.RuntimeParams["jit"]; !set {
		cfg.AfterConnect = jitOffWhenDirect
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, connectError(&cfg.ConnConfig.Config, err)
	}
	if !d.standbyOK {
		if err := checkPrimary(pctx, pool, &cfg.ConnConfig.Config); err != nil {
			pool.Close()
			return nil, err
		}
	}
	if needTables {
		if err := checkTables(pctx, pool, d.schema()); err != nil {
			pool.Close()
			return nil, err
		}
	}
	return pool, nil
}

// jitOffWhenDirect turns JIT off for the session of a connection that talks
// to a backend of its own, in one round trip: the statement does nothing
// through a pooler, whose connection ID is not the backend's. Through a
// pooler, set it for the role instead (ALTER ROLE … SET jit = off).
func jitOffWhenDirect(ctx context.Context, c *pgx.Conn) error {
	_, err := c.Exec(ctx, fmt.Sprintf("SELECT set_config('jit', 'off', false) WHERE pg_backend_pid() = %d", c.PgConn().PID()))
	return err
}

// maxURL bounds a connection string: libpq's own buffers stop far below.
const maxURL = 8 << 10

// checkURL refuses a URL that is oversized or holds a control character,
// and one whose user information pgx and a reader would
// split differently: an unencoded '@' in the password makes pgx take the
// rest of the password for the host, and print it in every error. The
// error names the cause and none of the URL.
func checkURL(u string) error {
	if len(u) > maxURL {
		return fmt.Errorf("%d bytes, longer than a connection string can be (%d)", len(u), maxURL)
	}
	for i := 0; i < len(u); i++ {
		if c := u[i]; c < 0x20 || c == 0x7f {
			return fmt.Errorf("a control character (0x%02x) at byte %d: a connection string holds none (percent-encode it where it belongs to a value)", c, i)
		}
	}
	if !utf8.ValidString(u) {
		return errors.New("not valid UTF-8: percent-encode the bytes of a name or password that are not text")
	}
	rest, ok := strings.CutPrefix(u, "postgres://")
	if !ok {
		if rest, ok = strings.CutPrefix(u, "postgresql://"); !ok {
			return nil // keyword/value: pgx's own parser, quoting rules
		}
	}
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		rest = rest[:i]
	}
	at := strings.LastIndexByte(rest, '@')
	switch {
	case strings.Count(rest, "@") > 1:
		return errors.New("the user information holds an unencoded '@': percent-encode it as %40 in the user name and password")
	case at >= 0 && strings.Contains(rest[:at], "/"):
		return errors.New("the user information holds an unencoded '/': percent-encode it as %2F in the user name and password")
	}
	return nil
}

// refusedStartupParameter reports whether pgErr (SQLSTATE 08P01) is a
// server, or a pooler in front of it, refusing a connection's start-up
// parameter: PgBouncer's "unsupported startup parameter", which it answers
// for every parameter it does not track (replication, options, search_path,
// jit).
func refusedStartupParameter(pgErr *pgconn.PgError) bool {
	return strings.Contains(strings.ToLower(pgErr.Message), "startup parameter")
}

// connectError names what a failed first connection means.
func connectError(cc *pgconn.Config, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "3D000": // invalid_catalog_name
			return fmt.Errorf("database %q does not exist on %s:%d: %s", cc.Database, cc.Host, cc.Port, pgErr.Message)
		case "28000", "28P01": // invalid_authorization_specification, invalid_password
			return fmt.Errorf("role %q cannot log in to %s:%d: %s", cc.User, cc.Host, cc.Port, pgErr.Message)
		case "42501":
			return fmt.Errorf("role %q may not connect to database %q: %s", cc.User, cc.Database, pgErr.Message)
		case "08P01":
			if refusedStartupParameter(pgErr) {
				return fmt.Errorf("%s:%d (a connection pooler) refused a start-up parameter of the URL: %s: remove it from the URL and set it for the role instead (ALTER ROLE … SET …); a pooler passes only the parameters it tracks", cc.Host, cc.Port, pgErr.Message)
			}
			return fmt.Errorf("PostgreSQL at %s:%d refused the connection: %w", cc.Host, cc.Port, err)
		default:
			return fmt.Errorf("PostgreSQL at %s:%d refused the connection: %w", cc.Host, cc.Port, err)
		}
	}
	return fmt.Errorf("PostgreSQL at %s:%d is unreachable: %w", cc.Host, cc.Port, err)
}

// errStandby is wrapped by open's error when the URL names a read-only
// standby.
var errStandby = errors.New("is a read-only standby")

// checkPrimary fails with a clear message when the server is a standby in
// recovery, where every write of the command would be refused (SQLSTATE
// 25006) and retried for nothing.
func checkPrimary(ctx context.Context, pool *pgxpool.Pool, cc *pgconn.Config) error {
	var standby bool
	if err := pool.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&standby); err != nil {
		return fmt.Errorf("check for a standby: %w", err)
	}
	if standby {
		return fmt.Errorf("PostgreSQL at %s:%d %w (in recovery): give the primary's URL (or, behind a failover address, the one that follows the primary)", cc.Host, cc.Port, errStandby)
	}
	return nil
}

// oncekitTables are the tables every command but migrate needs.
var oncekitTables = []string{"outbox", "relay_partitions", "processed_messages", "dead_letters", "side_effects", "idempotency_keys"}

// checkTables fails with a clear message when the migrations were not run.
func checkTables(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	var missing []string
	err := pool.QueryRow(ctx, `SELECT coalesce(array_agg(t ORDER BY t), '{}') FROM unnest($2::text[]) AS t
		WHERE to_regclass(format('%I.%I', $1::text, t)) IS NULL`, schema, oncekitTables).Scan(&missing)
	if err != nil {
		return fmt.Errorf("check tables: %w", err)
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: schema %q has no %s: run `oncekit migrate up --schema %s` first",
			errNoTables, schema, strings.Join(missing, ", "), schema)
	}
	return nil
}

// natsFlags are the flags of every command that talks to NATS.
type natsFlags struct {
	urlFlag envString
	e       *env
}

func (n *natsFlags) register(fs *flag.FlagSet, e *env) {
	n.e = e
	fs.Var(&n.urlFlag, "nats-url", "NATS server `URL` (default: env NATS_URL, else "+nats.DefaultURL+")")
}

// url is the NATS URL to dial.
func (n *natsFlags) url() string { return n.urlFlag.resolve(n.e, "NATS_URL", nats.DefaultURL) }

// connect dials NATS once, failing fast when it is unreachable at start, and
// reconnects forever afterwards.
func (n *natsFlags) connect(name string) (*nats.Conn, error) {
	nc, err := nats.Connect(n.url(),
		nats.Name(name),
		nats.Timeout(5*time.Second),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.ReconnectBufSize(-1), // never buffer publishes while disconnected: fail them
	)
	if err != nil {
		return nil, fmt.Errorf("NATS at %s is unreachable: %w", redact(n.url()), err)
	}
	return nc, nil
}

// configFlags maps the configuration fields a library names in its errors to
// the flags that set them.
type configFlags map[string]string

// usage turns a library's configuration error into a usage error that names
// the flag instead of the Go field ("outbox: RelayConfig.BatchSize: -1 is
// negative" becomes "--batch: -1 is negative").
func (m configFlags) usage(err error) error {
	msg := err.Error()
	if _, rest, ok := strings.Cut(msg, ": "); ok && !strings.Contains(msg[:len(msg)-len(rest)], " ") {
		msg = rest // the package prefix
	}
	if _, field, ok := strings.Cut(msg, "Config."); ok {
		for name, flag := range m {
			if strings.HasPrefix(field, name) && !isIdentChar(field, len(name)) {
				return usagef("%s%s", flag, field[len(name):])
			}
		}
	}
	return usagef("%s", msg)
}

func isIdentChar(s string, i int) bool {
	if i >= len(s) {
		return false
	}
	c := s[i]
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
