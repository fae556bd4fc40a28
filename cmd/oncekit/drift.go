package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit/drift"
	"github.com/oncekit/oncekit/migrations"
)

// Exit codes of `oncekit drift`: 0 clean, 1 drift, 2 usage, 3 could not run.
// Drift found wins over a check that could not run.
const (
	exitDrift      = 1 // a check found drift
	exitCheckError = 3 // a check, or the whole run, could not run
)

// listFlag collects a repeatable flag through parse.
type listFlag[T any] struct {
	items []T
	parse func(string) (T, error)
}

func (l *listFlag[T]) String() string { return "" }
func (l *listFlag[T]) Set(v string) error {
	it, err := l.parse(v)
	if err != nil {
		return err
	}
	l.items = append(l.items, it)
	return nil
}

func parseRule(v string) (drift.Rule, error) {
	name, sql, ok := strings.Cut(v, "=")
	if !ok {
		return drift.Rule{}, errors.New("want NAME=SQL")
	}
	return drift.Rule{Name: name, SQL: sql}, nil
}

func parseExpect(v string) (drift.Rule, error) {
	name, rest, ok1 := strings.Cut(v, "=")
	kind, sql, ok2 := strings.Cut(rest, ":")
	if !ok1 || !ok2 {
		return drift.Rule{}, errors.New("want NAME=KIND[@JSONPATH]:SOURCES_SQL")
	}
	kind, path, _ := strings.Cut(kind, "@")
	r := drift.ExpectEffects(name, kind, sql)
	r.Expect.BusinessID = path
	return r, nil
}

func parseHorizon(v string) (drift.Horizon, error) {
	consumer, d, ok := strings.Cut(v, "=")
	h, err := time.ParseDuration(d)
	if !ok || consumer == "" || err != nil || h <= 0 {
		return drift.Horizon{}, errors.New("want CONSUMER=DURATION, a positive duration")
	}
	return drift.Horizon{Consumer: consumer, Horizon: h}, nil
}

const driftUsage = `drift [flags]

Runs every check once and prints a table (or --json); exits 0 when clean,
1 on drift, 2 on bad usage, 3 when a check could not run (drift wins).
With --interval it runs forever and serves the figures on --listen.`

func runDrift(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "drift", driftUsage)
	var db dbFlags
	db.register(fs, e)
	var cfg drift.Config
	fs.DurationVar(&cfg.MaxOutboxAge, "max-outbox-age", time.Minute, "oldest an unpublished outbox row may be")
	fs.Int64Var(&cfg.MaxOutboxBacklog, "max-outbox-backlog", 100_000, "most unpublished outbox rows tolerated")
	fs.StringVar(&cfg.Slot, "slot", "", "`NAME` of the logical relay's replication slot (default oncekit_ and the schema); its checks find nothing without logical mode")
	fs.Int64Var(&cfg.MaxSlotLagBytes, "max-slot-lag", 1_000_000_000, "most WAL bytes the logical relay's slot may have left to confirm")
	fs.Int64Var(&cfg.MaxInactiveSlotRetainedBytes, "max-inactive-slot-retained", 100_000_000, "most WAL bytes the slot may keep while no relay streams from it")
	fs.DurationVar(&cfg.MaxPendingAge, "max-pending-age", 5*time.Minute, "how long past due a pending side effect may be")
	fs.DurationVar(&cfg.LeaseGrace, "lease-grace", time.Minute, "how long past its lease a fired effect or in-progress request may be")
	fs.DurationVar(&cfg.FailedWindow, "failed-window", 24*time.Hour, "effects_failed counts the effects recorded this recently that failed")
	fs.DurationVar(&cfg.Window, "window", 0, "expectations read only effects recorded this recently; {since} in SQL is its start (0: everything)")
	fs.DurationVar(&cfg.CheckTimeout, "check-timeout", 30*time.Second, "bound on each check; a check past it is reported and the others run")
	rules := &listFlag[drift.Rule]{parse: parseRule}
	expects := &listFlag[drift.Rule]{parse: parseExpect}
	horizons := &listFlag[drift.Horizon]{parse: parseHorizon}
	fs.Var(rules, "rule", "`NAME=SQL`: a check whose SQL returns one row per violation (repeatable)")
	fs.Var(expects, "expect", "`NAME=KIND[@JSONPATH]:SOURCES_SQL`: each business ID the SQL returns has exactly one side effect of KIND,\n"+
		"matched on source_id or on the payload's JSONPATH such as $.payment_id (repeatable)")
	fs.Var(horizons, "horizon", "`CONSUMER=DURATION`: the consumer's claims must reach back this far (its redelivery horizon; repeatable)")
	skips := &listFlag[string]{parse: func(v string) (string, error) { return v, nil }}
	fs.Var(skips, "skip", "`CHECK`: leave out this built-in check, such as effects_failed (repeatable)")
	rulesFile := fs.String("rules", "", "YAML file of thresholds, rules and horizons (flags given on the command line win)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	textfile := fs.String("textfile", "", "also write the figures to this file for node_exporter's textfile collector (*.prom)")
	interval := fs.Duration("interval", 0, "run every interval and serve metrics instead of once (0: once)")
	listen := fs.String("listen", "127.0.0.1:9092", "address of /healthz and /metrics with --interval (empty: off)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected arguments: %v", fs.Args())
	}
	if err := nonNegative(fs, "max-outbox-age", "max-pending-age", "lease-grace", "failed-window", "window", "check-timeout", "interval"); err != nil {
		return err
	}
	if cfg.MaxOutboxBacklog < 0 {
		return usagef("--max-outbox-backlog: %d is negative", cfg.MaxOutboxBacklog)
	}
	if cfg.MaxSlotLagBytes < 0 || cfg.MaxInactiveSlotRetainedBytes < 0 {
		return usagef("--max-slot-lag and --max-inactive-slot-retained must not be negative")
	}
	if *textfile != "" && *interval > 0 {
		return usagef("--textfile is for single runs; with --interval, scrape --listen")
	}
	if *rulesFile != "" {
		if err := applyRulesFile(fs, &cfg, *rulesFile); err != nil {
			return err
		}
	}
	cfg.Schema = db.schema()
	cfg.Rules = append(append(cfg.Rules, rules.items...), expects.items...)
	cfg.Horizons = append(cfg.Horizons, horizons.items...)
	cfg.Skip = append(cfg.Skip, skips.items...)
	if err := db.validate(); err != nil {
		return err
	}
	if _, err := drift.New(nil, &cfg); err != nil {
		return usagef("%v", err)
	}

	log, _ := newLogger(e, "text", "info")
	cfg.Logger = log
	// The textfile holds the drift figures only: node_exporter refuses
	// series that collide with its own (go_*, process_*).
	reg := prometheus.NewRegistry()
	if *interval > 0 {
		reg = newRegistry()
	}
	if *interval > 0 || *textfile != "" {
		cfg.Registerer = reg
	}
	if *interval <= 0 {
		cfg.Logger = discardLogger
	}
	db.standbyOK = true
	pool, err := db.openFor(ctx, migrations.Drift)
	if err != nil {
		var ue *usageError
		if errors.As(err, &ue) {
			return err
		}
		fmt.Fprintf(e.stderr, "oncekit drift: could not run: %s\n", redact(err.Error()))
		return &exitError{code: exitCheckError}
	}
	defer pool.Close()
	checker, err := drift.New(pool, &cfg)
	if err != nil {
		return usagef("%v", err)
	}
	once := func() (drift.Report, error) {
		rep, err := checker.Run(ctx)
		if *asJSON {
			return rep, rep.WriteJSON(e.stdout)
		}
		if werr := rep.WriteTable(e.stdout); werr != nil {
			return rep, werr
		}
		return rep, err
	}
	if *interval <= 0 {
		rep, err := once()
		if *textfile != "" {
			if werr := prometheus.WriteToTextfile(*textfile, reg); werr != nil {
				fmt.Fprintf(e.stderr, "oncekit drift: --textfile: %v\n", werr)
				return &exitError{code: exitCheckError}
			}
		}
		switch {
		case rep.Drifted():
			return &exitError{code: exitDrift}
		case rep.Failed() || err != nil:
			if err != nil && !errors.Is(err, drift.ErrCheckFailed) {
				fmt.Fprintf(e.stderr, "oncekit drift: %s\n", redact(err.Error()))
			} else {
				fmt.Fprintln(e.stderr, "oncekit drift: a check could not run (see ERROR above)")
			}
			return &exitError{code: exitCheckError}
		}
		return nil
	}
	if err := serveOps(ctx, log, *listen, reg, func(ctx context.Context) error { return pool.Ping(ctx) }); err != nil {
		return err
	}
	t := time.NewTicker(*interval)
	defer t.Stop()
	for {
		if rep, err := checker.Run(ctx); err != nil && !errors.Is(err, drift.ErrCheckFailed) {
			log.Error("drift run failed", "err", err)
		} else if rep.Drifted() {
			log.Warn("drift found")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// applyRulesFile reads the YAML rules file into cfg, keeping the thresholds
// given on the command line.
func applyRulesFile(fs *flag.FlagSet, cfg *drift.Config, path string) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	keep := *cfg
	f, err := os.Open(path)
	if err != nil {
		return usagef("--rules: %v", err)
	}
	defer f.Close()
	if err := drift.ReadRules(f, cfg); err != nil {
		return usagef("--rules %s: %v", path, err)
	}
	for name, pair := range map[string][2]*time.Duration{
		"max-outbox-age": {&cfg.MaxOutboxAge, &keep.MaxOutboxAge}, "max-pending-age": {&cfg.MaxPendingAge, &keep.MaxPendingAge},
		"lease-grace": {&cfg.LeaseGrace, &keep.LeaseGrace}, "failed-window": {&cfg.FailedWindow, &keep.FailedWindow},
		"window": {&cfg.Window, &keep.Window}, "check-timeout": {&cfg.CheckTimeout, &keep.CheckTimeout},
	} {
		if set[name] {
			*pair[0] = *pair[1]
		}
	}
	if set["max-outbox-backlog"] {
		cfg.MaxOutboxBacklog = keep.MaxOutboxBacklog
	}
	if set["max-slot-lag"] {
		cfg.MaxSlotLagBytes = keep.MaxSlotLagBytes
	}
	if set["max-inactive-slot-retained"] {
		cfg.MaxInactiveSlotRetainedBytes = keep.MaxInactiveSlotRetainedBytes
	}
	if set["slot"] {
		cfg.Slot = keep.Slot
	}
	return nil
}
