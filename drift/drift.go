package drift

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit/internal/pgsql"
)

// Config configures a Checker. The zero value works.
type Config struct {
	// Schema of oncekit's tables. Defaults to "oncekit".
	Schema string
	// MaxOutboxAge is the oldest an unpublished, unparked outbox row may be.
	// Defaults to 1 minute.
	MaxOutboxAge time.Duration
	// MaxOutboxBacklog is the most unpublished outbox rows tolerated.
	// Defaults to 100,000.
	MaxOutboxBacklog int64
	// MaxPendingAge is how long past due a pending side effect may be.
	// Defaults to 5 minutes.
	MaxPendingAge time.Duration
	// LeaseGrace is how long past its lease a fired effect or an in-progress
	// idempotency record may be before it counts. Defaults to 1 minute.
	LeaseGrace time.Duration
	// Rules are the user's own checks.
	Rules []Rule
	// Registerer receives the drift gauges. Nil means no metrics.
	Registerer prometheus.Registerer
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Rule is a user check: SQL that returns one row per violation, the first
// column describing it (cast to text). No rows means no drift. The SQL may use
// "{schema}" for oncekit's schema.
type Rule struct {
	// Name identifies the rule in reports and metrics: [a-z0-9_], unique.
	Name string
	// SQL returns the violating rows.
	SQL string
}

// ExpectEffects is the rule "every source returned by sourcesSQL has exactly
// one side effect of kind, and no effect of kind exists without a source".
// sourcesSQL returns one text column, the source IDs (the SourceID the
// handler passed to sideeffect.Record). Unique(source_id, kind) makes "more
// than one" impossible in the ledger, so the rule reports missing effects and
// effects without a source.
func ExpectEffects(name, kind, sourcesSQL string) Rule {
	q := fmt.Sprintf(`WITH src AS (SELECT DISTINCT s::text AS source_id FROM (%s) AS q(s))
SELECT 'missing ' || src.source_id FROM src
 WHERE NOT EXISTS (SELECT 1 FROM {schema}.side_effects e WHERE e.kind = %s AND e.source_id = src.source_id)
UNION ALL
SELECT 'without source ' || e.source_id FROM {schema}.side_effects e
 WHERE e.kind = %[2]s AND NOT EXISTS (SELECT 1 FROM src WHERE src.source_id = e.source_id)`,
		sourcesSQL, quoteLiteral(kind))
	return Rule{Name: name, SQL: q}
}

func quoteLiteral(s string) string {
	out := []byte{'\''}
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(append(out, '\''))
}

// ErrInvalidConfig is returned by New for a bad Config.
var ErrInvalidConfig = errors.New("drift: invalid config")

var ruleName = regexp.MustCompile(`^[a-z0-9_]{1,64}$`)

// Checker runs the checks.
type Checker struct {
	db      pgsql.Querier
	cfg     Config
	checks  []check
	metrics *metrics
}

// New returns a Checker over db for cfg (nil means the zero Config).
func New(db pgsql.Querier, cfg *Config) (*Checker, error) {
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	schema, err := pgsql.ValidateSchema(c.Schema)
	if err != nil {
		return nil, fmt.Errorf("%w: Schema: %v", ErrInvalidConfig, err)
	}
	c.Schema = schema
	if c.MaxOutboxAge <= 0 {
		c.MaxOutboxAge = time.Minute
	}
	if c.MaxOutboxBacklog <= 0 {
		c.MaxOutboxBacklog = 100_000
	}
	if c.MaxPendingAge <= 0 {
		c.MaxPendingAge = 5 * time.Minute
	}
	if c.LeaseGrace <= 0 {
		c.LeaseGrace = time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	seen := map[string]bool{}
	for i, r := range c.Rules {
		if !ruleName.MatchString(r.Name) {
			return nil, fmt.Errorf("%w: Rules[%d].Name %q: want [a-z0-9_]{1,64}", ErrInvalidConfig, i, r.Name)
		}
		if seen[r.Name] {
			return nil, fmt.Errorf("%w: Rules[%d].Name %q used twice", ErrInvalidConfig, i, r.Name)
		}
		if r.SQL == "" {
			return nil, fmt.Errorf("%w: Rules[%d].SQL is empty", ErrInvalidConfig, i)
		}
		seen[r.Name] = true
	}
	ch := &Checker{db: db, cfg: c, checks: builtins(c)}
	for _, r := range c.Rules {
		ch.checks = append(ch.checks, ruleCheck(r, schema))
	}
	if c.Registerer != nil {
		if ch.metrics, err = newMetrics(c.Registerer); err != nil {
			return nil, err
		}
	}
	return ch, nil
}

// Finding is the outcome of one check.
type Finding struct {
	// Check names the check ("outbox_oldest_age_seconds", a rule's name, …).
	Check string
	// Value is the figure measured: a count, or seconds for ages.
	Value float64
	// Limit is the most Value may be without drift.
	Limit float64
	// Drift is true when Value exceeds Limit.
	Drift bool
	// Examples describe up to a few violating rows (rules only).
	Examples []string
}

// Report is the result of one run.
type Report struct {
	At       time.Time
	Findings []Finding
}

// Drifted reports whether any check found drift.
func (r Report) Drifted() bool {
	for _, f := range r.Findings {
		if f.Drift {
			return true
		}
	}
	return false
}

// Run executes every check once and returns the report. A check that cannot
// run (the database is down, a rule's SQL is wrong) is an error: no report is
// better than a reassuring one.
func (c *Checker) Run(ctx context.Context) (Report, error) {
	rep := Report{At: time.Now()}
	for _, chk := range c.checks {
		f, err := chk.run(ctx, c.db)
		if err != nil {
			return Report{}, fmt.Errorf("drift: check %s: %w", chk.name, err)
		}
		rep.Findings = append(rep.Findings, f)
		if f.Drift {
			c.cfg.Logger.Warn("drift", "check", f.Check, "value", f.Value, "limit", f.Limit)
		}
	}
	if c.metrics != nil {
		c.metrics.observe(rep)
	}
	return rep, nil
}
