package drift

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/cfgerr"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/outbox"
)

// Config configures a Checker. The zero value works.
type Config struct {
	// Schema of oncekit's tables. Defaults to oncekit.DefaultSchema.
	Schema string
	// MaxOutboxAge is the oldest an unpublished, unparked outbox row may be.
	// Defaults to 1 minute.
	MaxOutboxAge time.Duration
	// MaxOutboxBacklog is the most unpublished outbox rows tolerated.
	// Defaults to 100,000.
	MaxOutboxBacklog int64
	// Slot names the logical relay's replication slot
	// (outbox.Config.Slot). Defaults to "oncekit_" and the schema. The
	// slot checks find nothing where logical mode is not set up.
	Slot string
	// MaxSlotLagBytes is the most WAL the slot may have left to confirm
	// (outbox_slot_lag_bytes). Defaults to 1 GB.
	MaxSlotLagBytes int64
	// MaxInactiveSlotRetainedBytes is the most WAL the slot may keep
	// while no relay streams from it (outbox_slot_inactive_retained_bytes).
	// Defaults to 100 MB.
	MaxInactiveSlotRetainedBytes int64
	// MaxPendingAge is how long past due a pending side effect may be.
	// Defaults to 5 minutes.
	MaxPendingAge time.Duration
	// LeaseGrace is how long past its lease a fired effect or an in-progress
	// idempotency record may be before it counts. Defaults to 1 minute.
	LeaseGrace time.Duration
	// FailedWindow is how far back the effects_failed check looks for
	// effects that failed (recorded within it). Defaults to 24 hours.
	FailedWindow time.Duration
	// Window, when positive, bounds what the expectations read on large
	// tables: only side effects recorded within Window are matched, and the
	// sources SQL may use "{since}" (now() minus Window) to select the
	// sources of the same period. Zero reads everything.
	Window time.Duration
	// CheckTimeout bounds each check. A check past it, or one that fails,
	// is reported as such (Finding.Error) and the others still run.
	// Defaults to 30 seconds.
	CheckTimeout time.Duration
	// Concurrency is how many checks run at once. Defaults to 4.
	Concurrency int
	// MaxIDs bounds the IDs an expectation lists as missing and as extra.
	// Defaults to 100.
	MaxIDs int
	// Rules are the user's own checks.
	Rules []Rule
	// Horizons are the consumers whose claims in processed_messages must
	// cover their redelivery horizon.
	Horizons []Horizon
	// Skip names built-in checks to leave out (such as "effects_failed"
	// while known failures are being handled).
	Skip []string
	// Registerer receives the drift gauges. Nil means no metrics.
	Registerer prometheus.Registerer
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// ErrInvalidConfig is returned by New for a bad Config.
var ErrInvalidConfig = errors.New("drift: invalid config")

// ErrCheckFailed is wrapped by the error Run returns when a check could not
// run (its Finding carries the reason).
var ErrCheckFailed = errors.New("drift: a check could not run")

var ruleName = regexp.MustCompile(`^[a-z0-9_]{1,64}$`)

// Checker runs the checks.
type Checker struct {
	db      oncekit.Querier
	cfg     Config
	checks  []check
	metrics *metrics
}

// New returns a Checker over db for cfg (nil means the zero Config). db must
// begin transactions (a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx): every check
// runs in a READ ONLY transaction of its own with a statement timeout of
// CheckTimeout. Rules are the operator's SQL, run with the role's
// privileges: give the drift job a role that can only read.
func New(db oncekit.Querier, cfg *Config) (*Checker, error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	if _, ok := db.(beginner); !ok && db != nil {
		return nil, fmt.Errorf("%w: drift: New: db %T does not begin transactions (pass a pool, a connection or a transaction)", ErrInvalidConfig, db)
	}
	ch := &Checker{db: db, cfg: c}
	skip := map[string]bool{}
	for _, name := range c.Skip {
		skip[name] = true
	}
	for _, b := range builtins(c) {
		if !skip[b.name] {
			ch.checks = append(ch.checks, b)
		}
	}
	for _, r := range c.Rules {
		ch.checks = append(ch.checks, r.check(c))
	}
	if len(c.Horizons) > 0 {
		ch.checks = append(ch.checks, horizonCheck(c))
	}
	if c.Registerer != nil {
		var err error
		if ch.metrics, err = newMetrics(c.Registerer); err != nil {
			return nil, err
		}
	}
	return ch, nil
}

// withDefaults returns a copy of c (the zero Config if nil) with defaults set.
func (c *Config) withDefaults() Config {
	out := cfgerr.CopyOf(c)
	out.Schema = cmp.Or(out.Schema, pgsql.DefaultSchema)
	out.MaxOutboxAge = cmp.Or(out.MaxOutboxAge, time.Minute)
	out.MaxPendingAge = cmp.Or(out.MaxPendingAge, 5*time.Minute)
	out.LeaseGrace = cmp.Or(out.LeaseGrace, time.Minute)
	out.FailedWindow = cmp.Or(out.FailedWindow, 24*time.Hour)
	out.CheckTimeout = cmp.Or(out.CheckTimeout, 30*time.Second)
	out.MaxOutboxBacklog = cmp.Or(out.MaxOutboxBacklog, 100_000)
	out.MaxSlotLagBytes = cmp.Or(out.MaxSlotLagBytes, 1_000_000_000)
	out.MaxInactiveSlotRetainedBytes = cmp.Or(out.MaxInactiveSlotRetainedBytes, 100_000_000)
	out.Concurrency = cmp.Or(out.Concurrency, 4)
	out.MaxIDs = cmp.Or(out.MaxIDs, 100)
	out.Logger = cmp.Or(out.Logger, slog.Default())
	return out
}

// validate returns an error naming the first bad field, wrapping
// ErrInvalidConfig.
func (c *Config) validate() error {
	bad := cfgerr.For(ErrInvalidConfig, "drift: Config")
	if err := bad.IfNegative(c, "MaxOutboxAge", "MaxPendingAge", "LeaseGrace", "FailedWindow",
		"Window", "CheckTimeout", "MaxOutboxBacklog", "MaxSlotLagBytes", "MaxInactiveSlotRetainedBytes", "Concurrency", "MaxIDs"); err != nil {
		return err
	}
	if _, err := pgsql.ValidateSchema(c.Schema); err != nil {
		return bad("Schema", "%w", err)
	}
	if _, err := outbox.New(&outbox.Config{Schema: c.Schema, Slot: c.Slot}); err != nil {
		return bad("Slot", "%w", err)
	}
	seen := map[string]bool{}
	for _, b := range builtins(*c) {
		seen[b.name] = true
	}
	for _, name := range c.Skip {
		if !seen[name] {
			return bad("Skip", "%q is not a built-in check", name)
		}
	}
	for i, r := range c.Rules {
		if err := r.validate(); err != nil {
			return bad(fmt.Sprintf("Rules[%d]", i), "%w", err)
		}
		if seen[r.Name] {
			return bad(fmt.Sprintf("Rules[%d].Name", i), "%q used twice", r.Name)
		}
		seen[r.Name] = true
	}
	for i, h := range c.Horizons {
		if h.Consumer == "" || h.Horizon <= 0 {
			return bad(fmt.Sprintf("Horizons[%d]", i), "want a consumer and a positive horizon")
		}
	}
	return nil
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
	// Error, when set, says why the check could not run (it timed out, its
	// SQL is wrong, the database is down); Value and Drift then mean nothing.
	Error string
	// Examples describe up to a few violating rows.
	Examples []string
	// IDs identify the offending rows of a built-in check (effect, dead
	// letter or outbox message IDs), at most Config.MaxIDs of them.
	IDs []string
	// Missing lists the business IDs an expectation found without their
	// effect (at most Config.MaxIDs; MissingTotal counts them all).
	Missing []string
	// Extra lists the business IDs an expectation found with an effect too
	// many: an effect without a source, or a second effect of the kind for
	// one business ID (at most Config.MaxIDs; ExtraTotal counts them all).
	Extra []string
	// MissingTotal and ExtraTotal count the missing and extra IDs.
	MissingTotal, ExtraTotal int64
	// Duration is how long the check took.
	Duration time.Duration
}

// Failed reports whether the check could not run.
func (f Finding) Failed() bool { return f.Error != "" }

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

// Failed reports whether any check could not run.
func (r Report) Failed() bool {
	for _, f := range r.Findings {
		if f.Failed() {
			return true
		}
	}
	return false
}

// Run executes every check once, each under Config.CheckTimeout and at most
// Config.Concurrency at a time, and returns the report with one finding per
// check, in the order of the checks. A check that cannot run (the database is
// down, a rule's SQL is wrong, it timed out) is reported in its finding, the
// others still run, and Run returns an error wrapping ErrCheckFailed along
// with the report: no check is ever silently reassuring.
func (c *Checker) Run(ctx context.Context) (Report, error) {
	rep := Report{At: time.Now(), Findings: make([]Finding, len(c.checks))}
	sem := make(chan struct{}, c.cfg.Concurrency)
	var wg sync.WaitGroup
	for i, chk := range c.checks {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			rep.Findings[i] = c.runOne(ctx, chk)
		}()
	}
	wg.Wait()
	var errs []error
	for _, f := range rep.Findings {
		switch {
		case f.Failed():
			errs = append(errs, fmt.Errorf("check %s: %s", f.Check, f.Error))
			c.cfg.Logger.Error("drift check could not run", "check", f.Check, "err", f.Error)
		case f.Drift:
			c.cfg.Logger.Warn("drift", "check", f.Check, "value", f.Value, "limit", f.Limit)
		}
	}
	if c.metrics != nil {
		c.metrics.observe(rep)
	}
	if len(errs) > 0 {
		return rep, fmt.Errorf("%w: %w", ErrCheckFailed, errors.Join(errs...))
	}
	return rep, nil
}

// beginner begins a transaction: a pool or a connection (BEGIN), or a
// transaction (a savepoint).
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// statementTimeoutSlack is how much longer than CheckTimeout the server lets
// a check's statement run: the context's deadline cancels it first, and the
// statement timeout ends it should the cancellation be lost.
const statementTimeoutSlack = time.Second

// readOnly runs chk in a READ ONLY transaction whose statements time out
// soon after CheckTimeout, then rolls it back: a rule is the operator's SQL, and
// a mistake in it (a function that writes, a query that never ends) fails
// the check instead of changing data or holding a backend. On a transaction
// it runs under a savepoint, whose settings end with it.
func (c *Checker) readOnly(ctx context.Context, chk check) (Finding, error) {
	tx, err := c.db.(beginner).Begin(ctx)
	if err != nil {
		return Finding{}, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT set_config('transaction_read_only', 'on', true), set_config('statement_timeout', $1, true)`,
		strconv.FormatInt((c.cfg.CheckTimeout+statementTimeoutSlack).Milliseconds(), 10)); err != nil {
		return Finding{}, fmt.Errorf("read-only transaction: %w", err)
	}
	return chk.run(ctx, tx)
}

// runOne runs chk under the check timeout.
func (c *Checker) runOne(ctx context.Context, chk check) Finding {
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, c.cfg.CheckTimeout)
	defer cancel()
	f, err := c.readOnly(cctx, chk)
	f.Check, f.Duration = chk.name, time.Since(start)
	if err != nil {
		var pgErr *pgconn.PgError
		if (cctx.Err() == context.DeadlineExceeded && ctx.Err() == nil) || (errors.As(err, &pgErr) && pgErr.Code == "57014") {
			// The context's deadline, or the statement timeout it set.
			err = fmt.Errorf("timed out after %s", c.cfg.CheckTimeout)
		}
		return Finding{Check: chk.name, Limit: chk.limit, Error: err.Error(), Duration: f.Duration}
	}
	return f
}
