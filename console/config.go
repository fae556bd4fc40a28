package console

import (
	"cmp"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/drift"
	"github.com/oncekit/oncekit/internal/cfgerr"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/outbox/fleet"
)

// Config configures a console. The zero value serves a read-only console
// of the default schema.
type Config struct {
	// Schema holds oncekit's tables. Defaults to oncekit.DefaultSchema.
	Schema string
	// Slot names the logical relay's replication slot
	// (outbox.Config.Slot), shown on the overview and outbox pages when
	// the schema runs in logical mode. Defaults to "oncekit_" and the
	// schema.
	Slot string
	// Prefix is the path the console is served under, behind a reverse
	// proxy or in a service's mux ("/ops/oncekit"): it strips it from
	// requests and writes it into links. Defaults to "" (the root).
	Prefix string
	// Writes enables the actions (unpark, replay, resolve, retry). Defaults
	// to false: read-only.
	Writes bool
	// Operators are the HTTP basic credentials (name → password) of the
	// operators allowed to act. Passwords are compared in constant time
	// and never shown.
	Operators map[string]string
	// TrustedHeader names a request header in which a reverse proxy that
	// authenticated the operator puts their name (such as
	// "X-Forwarded-User"). Set it only behind a proxy that removes the
	// header from clients' requests. With writes on, Operators or
	// TrustedHeader is required.
	TrustedHeader string
	// Reveal lets an operator show a payload or a stored response on
	// request; otherwise they stay hidden. Sealed bodies are never opened.
	// Defaults to false.
	Reveal bool
	// Publisher replays dead letters: the publisher of the broker the
	// consumers read. Nil: replay is not offered.
	Publisher broker.Publisher
	// Derive lists the names a service derives its events' IDs with from
	// an operation's ID (oncekit.DeriveID(id, name)), so that the chain
	// finds them: "PaymentCreated", say.
	Derive []string
	// Drift configures the checks the drift page runs on demand; its
	// Schema is the console's. Nil: the built-in checks.
	Drift *drift.Config
	// Overdue and Recent are the overview's windows, as `oncekit status`
	// takes them. Default to 5 minutes and 24 hours.
	Overdue, Recent time.Duration
	// Fleet lists the databases of a relay fleet (outbox/fleet) for the
	// fleet page, which shows each database's backlog, oldest unpublished
	// event, parked rows and partition leases, and why one that could not
	// be read is down; it is called at each view, so a list that operators
	// edit (fleet.ReadFile of their file) shows as it is now. Nil: no fleet
	// page.
	Fleet func() ([]fleet.Database, error)
	// FleetTimeout bounds the read of each database on the fleet page,
	// connecting included: a database that does not answer within it is
	// shown down, and the others are not delayed. Defaults to 5 seconds.
	FleetTimeout time.Duration
	// Logger receives the console's logs (every action). Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// ErrInvalidConfig is wrapped by New's error for a bad Config; the error's
// text names the field.
var ErrInvalidConfig = errors.New("console: invalid config")

func (c *Config) withDefaults() Config {
	out := cfgerr.CopyOf(c)
	out.Schema = cmp.Or(out.Schema, pgsql.DefaultSchema)
	out.Prefix = strings.TrimSuffix(out.Prefix, "/")
	out.Overdue = cmp.Or(out.Overdue, 5*time.Minute)
	out.Recent = cmp.Or(out.Recent, 24*time.Hour)
	out.FleetTimeout = cmp.Or(out.FleetTimeout, 5*time.Second)
	out.Logger = cmp.Or(out.Logger, slog.Default())
	if out.TrustedHeader != "" {
		out.TrustedHeader = http.CanonicalHeaderKey(out.TrustedHeader)
	}
	return out
}

func (c *Config) validate() error {
	bad := cfgerr.For(ErrInvalidConfig, "console: Config")
	if _, err := pgsql.ValidateSchema(c.Schema); err != nil {
		return bad("Schema", "%w", err)
	}
	if c.Prefix != "" && !strings.HasPrefix(c.Prefix, "/") {
		return bad("Prefix", "%q must start with /", c.Prefix)
	}
	if c.Writes && len(c.Operators) == 0 && c.TrustedHeader == "" {
		return bad("Writes", "set Operators or TrustedHeader: every action needs an authenticated operator")
	}
	for name, pw := range c.Operators {
		if name == "" || strings.ContainsAny(name, ":\r\n") || len(pw) < 12 {
			return bad("Operators", "each needs a name without ':' and a password of 12 characters or more")
		}
	}
	return bad.IfNegative(c, "Overdue", "Recent", "FleetTimeout")
}
