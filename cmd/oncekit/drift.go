package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/oncekit/oncekit/drift"
)

func init() {
	register(&command{name: "drift", summary: "check that the chain held: lag, stuck effects, unknowns, dead letters, rules", run: runDrift})
}

// Exit codes of `oncekit drift`.
const (
	exitDrift      = 1 // a check found drift
	exitCheckError = 3 // a check could not run
)

// ruleFlags collects repeatable --rule/--expect flags.
type ruleFlags struct {
	rules []drift.Rule
	parse func(string) (drift.Rule, error)
}

func (r *ruleFlags) String() string { return fmt.Sprint(len(r.rules)) }
func (r *ruleFlags) Set(v string) error {
	rule, err := r.parse(v)
	if err != nil {
		return err
	}
	r.rules = append(r.rules, rule)
	return nil
}

func runDrift(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "drift", "drift [flags]")
	var db dbFlags
	db.register(fs, e)
	var cfg drift.Config
	fs.DurationVar(&cfg.MaxOutboxAge, "max-outbox-age", time.Minute, "oldest an unpublished outbox row may be")
	fs.Int64Var(&cfg.MaxOutboxBacklog, "max-outbox-backlog", 100_000, "most unpublished outbox rows tolerated")
	fs.DurationVar(&cfg.MaxPendingAge, "max-pending-age", 5*time.Minute, "how long past due a pending side effect may be")
	fs.DurationVar(&cfg.LeaseGrace, "lease-grace", time.Minute, "how long past its lease a fired effect or in-progress request may be")
	rules := &ruleFlags{parse: func(v string) (drift.Rule, error) {
		name, sql, ok := strings.Cut(v, "=")
		if !ok {
			return drift.Rule{}, fmt.Errorf("want NAME=SQL")
		}
		return drift.Rule{Name: name, SQL: sql}, nil
	}}
	expects := &ruleFlags{parse: func(v string) (drift.Rule, error) {
		name, rest, ok1 := strings.Cut(v, "=")
		kind, sql, ok2 := strings.Cut(rest, ":")
		if !ok1 || !ok2 {
			return drift.Rule{}, fmt.Errorf("want NAME=KIND:SOURCES_SQL")
		}
		return drift.ExpectEffects(name, kind, sql), nil
	}}
	fs.Var(rules, "rule", "NAME=SQL: a check whose SQL returns one row per violation (repeatable)")
	fs.Var(expects, "expect", "NAME=KIND:SOURCES_SQL: each source ID the SQL returns has exactly one side effect of KIND (repeatable)")
	interval := fs.Duration("interval", 0, "run every interval and serve metrics instead of once (0: once)")
	listen := fs.String("listen", ":9092", "address of /healthz and /metrics with --interval (empty: off)")
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg.Schema = db.schema
	cfg.Rules = append(rules.rules, expects.rules...)

	pool, err := db.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	log := slog.New(slog.NewTextHandler(e.stderr, nil))
	cfg.Logger = slog.New(slog.DiscardHandler)
	reg := newRegistry()
	if *interval > 0 {
		cfg.Registerer = reg
	}
	checker, err := drift.New(pool, &cfg)
	if err != nil {
		return usagef("%v", err)
	}
	once := func() (bool, error) {
		rep, err := checker.Run(ctx)
		if err != nil {
			return false, err
		}
		if err := rep.WriteTable(e.stdout); err != nil {
			return false, err
		}
		return rep.Drifted(), nil
	}
	if *interval <= 0 {
		drifted, err := once()
		if err != nil {
			fmt.Fprintf(e.stderr, "oncekit drift: %v\n", err)
			return &exitError{code: exitCheckError}
		}
		if drifted {
			return &exitError{code: exitDrift}
		}
		return nil
	}
	if err := serveOps(ctx, log, *listen, reg, func(ctx context.Context) error { return pool.Ping(ctx) }); err != nil {
		return err
	}
	t := time.NewTicker(*interval)
	defer t.Stop()
	for {
		if drifted, err := once(); err != nil {
			log.Error("drift run failed", "err", err)
		} else if drifted {
			log.Warn("drift found")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

var _ flag.Value = (*ruleFlags)(nil)
