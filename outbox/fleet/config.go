package fleet

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit/internal/cfgerr"
	"github.com/oncekit/oncekit/internal/nodeid"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/redact"
	"github.com/oncekit/oncekit/outbox"
)

// ErrInvalidConfig is wrapped by the errors of New, Set and ReadFile for a
// bad Config or database list.
var ErrInvalidConfig = errors.New("fleet: invalid configuration")

// Database is one database the fleet serves: an outbox in Schema of the
// database at URL.
type Database struct {
	// Name identifies the database in the fleet: the key of its
	// assignment, and its label in metrics and logs. Letters, digits, '_'
	// and '-', at most 63 bytes; unique in the set.
	Name string `json:"name"`
	// URL is a PostgreSQL connection string (URL or keyword/value). It is
	// never logged.
	URL string `json:"url"`
	// Schema holds oncekit's tables there. Defaults to
	// oncekit.DefaultSchema.
	Schema string `json:"schema,omitempty"`
}

// Config configures a Fleet. The zero value works.
type Config struct {
	// ID names this member in the fleet and in the lease tables of its
	// databases: valid UTF-8 without control characters, at most 255
	// bytes. Defaults to hostname-pid-random.
	ID string
	// Group names the process, host or zone this member shares with other
	// members, whose death would take them all: a database's Replicas
	// members are taken from as many groups as there are (AssignSpread).
	// Same rules as ID. Defaults to ID: each member a group of its own.
	// Members of one process should share a group.
	Group string
	// Bucket is the JetStream key-value bucket the members keep their
	// entries in; fleets with different buckets do not see each other.
	// Defaults to "oncekit_fleet".
	Bucket string
	// BucketReplicas is the bucket's replicas when a member creates or
	// updates it. Defaults to 1; on a JetStream cluster set it to the
	// cluster's size (at most 5), or the members lose sight of each other
	// while the one node holding the bucket is down or just back.
	BucketReplicas int
	// Replicas is k, the number of members that serve each database (all
	// of them when fewer). Defaults to 3.
	Replicas int
	// MemberTTL is how long a member's entry outlives its last refresh;
	// entries are refreshed, and the members listed, every MemberTTL/3. A
	// changed list is acted on once it has stood for MemberTTL/3 (the
	// latest after MemberTTL while it keeps changing), so a member gone
	// without leaving is replaced after at most 4/3 MemberTTL; its
	// partitions are taken by the database's other relays as soon as its
	// leases run out. Every member of a fleet must use the same (the
	// bucket holds one TTL). Defaults to 15s.
	MemberTTL time.Duration
	// MaxConnsPerDatabase caps Budget, the connections this member opens to
	// one database. Defaults to 5; at least 2.
	MaxConnsPerDatabase int
	// ApplicationName is the application_name of the fleet's connections
	// (to count them in pg_stat_activity). Defaults to "oncekit-fleet".
	ApplicationName string
	// ConnectTimeout bounds one connection attempt, so that a database
	// that hangs its connections is backed off like one that refuses them.
	// Defaults to 5s.
	ConnectTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait before a database whose
	// relay could not start (unreachable, refusing, wrong credentials, no
	// migrations) is tried again. Default to 1s and 1m.
	MinBackoff, MaxBackoff time.Duration
	// Relay is the template of each database's relay configuration; its ID,
	// Logger and Registerer are the fleet's, and it always polls (PollOnly:
	// no connection held for LISTEN, and it works behind a transaction
	// pooler).
	Relay outbox.RelayConfig
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the fleet's metrics and its relays' (the latter
	// with a database label). Nil means no metrics.
	Registerer prometheus.Registerer
}

// withDefaults returns a copy of c (the zero Config if nil) with defaults
// set.
func (c *Config) withDefaults() Config {
	out := cfgerr.CopyOf(c)
	if out.ID == "" {
		out.ID = nodeid.New()
	}
	out.Group = cmp.Or(out.Group, out.ID)
	out.Bucket = cmp.Or(out.Bucket, "oncekit_fleet")
	out.BucketReplicas = cmp.Or(out.BucketReplicas, 1)
	out.Replicas = cmp.Or(out.Replicas, 3)
	out.MemberTTL = cmp.Or(out.MemberTTL, 15*time.Second)
	out.MaxConnsPerDatabase = cmp.Or(out.MaxConnsPerDatabase, 5)
	out.ApplicationName = cmp.Or(out.ApplicationName, "oncekit-fleet")
	out.ConnectTimeout = cmp.Or(out.ConnectTimeout, 5*time.Second)
	out.MinBackoff = cmp.Or(out.MinBackoff, time.Second)
	out.MaxBackoff = cmp.Or(out.MaxBackoff, time.Minute)
	out.Logger = cmp.Or(out.Logger, slog.Default())
	return out
}

// validate returns an error naming the first bad field, wrapping
// ErrInvalidConfig.
func (c *Config) validate() error {
	bad := cfgerr.For(ErrInvalidConfig, "fleet: Config")
	if err := bad.IfNegative(c, "Replicas", "MaxConnsPerDatabase", "ConnectTimeout", "MinBackoff", "MaxBackoff"); err != nil {
		return err
	}
	if err := bad.IfNotID(c, "ID", "Group"); err != nil {
		return err
	}
	switch {
	case !validKey.MatchString(c.Bucket):
		return bad("Bucket", "%q is not a bucket name (letters, digits, '_', '-')", c.Bucket)
	case c.BucketReplicas < 1 || c.BucketReplicas > 5:
		return bad("BucketReplicas", "%d is not 1 to 5", c.BucketReplicas)
	case c.MemberTTL < time.Second:
		return bad("MemberTTL", "%v is below 1s", c.MemberTTL)
	case c.MaxConnsPerDatabase < 2:
		return bad("MaxConnsPerDatabase", "%d is below 2", c.MaxConnsPerDatabase)
	case c.MaxBackoff < c.MinBackoff:
		return bad("MaxBackoff", "%v is below MinBackoff (%v)", c.MaxBackoff, c.MinBackoff)
	}
	return nil
}

var (
	validKey  = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	validName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,63}$`)
)

// checkDatabases returns an error naming the first bad entry of dbs: a bad
// name, an empty URL, or a name or outbox (server, database and schema)
// listed twice.
// No URL appears in it.
func checkDatabases(dbs []Database) error {
	names := map[string]bool{}
	outboxes := map[[2]string]string{}
	for i, d := range dbs {
		switch {
		case !validName.MatchString(d.Name):
			return fmt.Errorf("%w: database %d: name %q: letters, digits, '_' and '-' only, 1 to 63 bytes", ErrInvalidConfig, i, d.Name)
		case names[d.Name]:
			return fmt.Errorf("%w: database %q listed twice", ErrInvalidConfig, d.Name)
		case d.URL == "":
			return fmt.Errorf("%w: database %q: url is empty", ErrInvalidConfig, d.Name)
		}
		if _, err := outbox.New(&outbox.Config{Schema: d.Schema}); err != nil {
			return fmt.Errorf("%w: database %q: %w", ErrInvalidConfig, d.Name, err)
		}
		names[d.Name] = true
		key := [2]string{server(d.URL), cmp.Or(d.Schema, pgsql.DefaultSchema)}
		if other, ok := outboxes[key]; ok {
			return fmt.Errorf("%w: databases %q and %q are one outbox (same server, database and schema)", ErrInvalidConfig, other, d.Name)
		}
		outboxes[key] = d.Name
	}
	return nil
}

// server is the host, port and database a connection string names, so
// that one database spelt two ways (a URL and keyword/value settings,
// another user or other parameters) is seen once; the string itself when
// it does not parse (its relay then fails and is backed off). Host names
// are not resolved: an alias is not seen.
func server(url string) string {
	c, err := pgconn.ParseConfig(url)
	if err != nil {
		return url
	}
	return fmt.Sprintf("%s:%d/%s", c.Host, c.Port, c.Database)
}

// ReadFile reads a database list from a JSON file: an array of objects
// with "name", "url" and (optionally) "schema", checked as Set checks them.
// Errors name the file and the entry, never a URL.
func ReadFile(path string) ([]Database, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	return parseList(path, b)
}

// parseList parses and checks the database list b read from path.
func parseList(path string, b []byte) ([]Database, error) {
	var dbs []Database
	if err := json.Unmarshal(b, &dbs); err != nil {
		return nil, fmt.Errorf("%w: %s: %s", ErrInvalidConfig, path, redact.String(err.Error()))
	}
	if err := checkDatabases(dbs); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return dbs, nil
}
