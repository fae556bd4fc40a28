package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/oncekit/oncekit/migrations"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/outbox/fleet"
	"github.com/oncekit/oncekit/report"
)

const statusUsage = `status [--json] [--metrics URL ...] [--standby-url URL]
status --fleet FILE [--json] [--timeout D]

Reads every figure in one read-only transaction, each through an index or
under a limit. Inbox processed and duplicate counts live in the consumers'
metrics: give their /metrics URLs with --metrics to show them.

With --fleet, reads the databases of a relay fleet's list, 16 at a time,
and prints a line each: its backlog, the age of its oldest unpublished event,
its parked rows and the partitions under a live lease. A database not read
within --timeout (connecting included), refusing the connection or the
credentials, or without the migrations is shown DOWN with the reason,
without delaying the others, and the command then exits 1.`

func runStatus(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "status", statusUsage)
	var db dbFlags
	db.register(fs, e)
	asJSON := fs.Bool("json", false, "print the figures as JSON")
	overdue := fs.Duration("overdue", 5*time.Minute, "a pending effect this far past due counts as overdue")
	recent := fs.Duration("recent", 24*time.Hour, "confirmed and failed effects are counted over this window")
	var standbyURL envString
	fs.Var(&standbyURL, "standby-url", "PostgreSQL `URL` of a standby a failover may promote: the slot's line says whether its copy of the slot is ready (default: env ONCEKIT_STANDBY_URL, else none)")
	slot := fs.String("slot", "", "`NAME` of the logical relay's replication slot, shown when the schema runs in logical mode (default oncekit_ and the schema)")
	metricsURLs := &listFlag[string]{parse: func(v string) (string, error) {
		if !strings.HasPrefix(v, "http://") && !strings.HasPrefix(v, "https://") {
			return "", fmt.Errorf("want an http(s) URL")
		}
		return v, nil
	}}
	fs.Var(metricsURLs, "metrics", "a consumer's /metrics `URL`, for its processed and duplicate counts (repeatable)")
	fleetFile := fs.String("fleet", "", "`FILE` listing a relay fleet's databases (as `oncekit relay --fleet`): a line per database instead of one database's status")
	timeout := fs.Duration("timeout", 5*time.Second, "with --fleet, the longest wait for one database, connecting included")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected arguments: %v", fs.Args())
	}
	if *fleetFile != "" {
		return runFleetStatus(ctx, e, fs, *fleetFile, *timeout, *asJSON)
	}
	if flagSet(fs, "timeout") {
		return usagef("--timeout needs --fleet")
	}
	if err := nonNegative(fs, "overdue", "recent"); err != nil {
		return err
	}
	standby := standbyURL.resolve(e, "ONCEKIT_STANDBY_URL", "")
	if err := checkURL(standby); standby != "" && err != nil {
		return usagef("--standby-url: %v", err)
	}
	db.standbyOK = true
	pool, err := db.openFor(ctx, migrations.Drift)
	if err != nil {
		return err
	}
	defer pool.Close()
	var rep report.Status
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		rep, err = report.Read(ctx, tx, db.schema(), *slot, *overdue, *recent)
		return err
	})
	if err != nil {
		return err
	}
	if standby != "" && rep.Outbox.Slot != nil {
		if err := addStandbyCopy(ctx, &rep, db.schema(), *slot, standby); err != nil {
			return err
		}
	}
	for _, u := range metricsURLs.items {
		if err := addConsumerMetrics(ctx, &rep, u); err != nil {
			return err
		}
	}
	if *asJSON {
		return writeJSON(e.stdout, rep)
	}
	return writeStatus(e, rep)
}

// runFleetStatus is `oncekit status --fleet FILE`.
func runFleetStatus(ctx context.Context, e *env, fs *flag.FlagSet, file string, timeout time.Duration, asJSON bool) error {
	for _, n := range []string{"database-url", "schema", "standby-url", "slot", "metrics", "overdue", "recent"} {
		if flagSet(fs, n) {
			return usagef("--fleet reads the databases its file lists: --%s does not apply", n)
		}
	}
	if timeout <= 0 {
		return usagef("--timeout: %v is not positive", timeout)
	}
	dbs, err := fleet.ReadFile(file)
	if err != nil {
		return usagef("--fleet: %v", err)
	}
	rows := fleet.ReadStatus(ctx, dbs, timeout, "oncekit-status")
	if asJSON {
		err = writeJSON(e.stdout, rows)
	} else {
		err = writeFleetStatus(e.stdout, rows)
	}
	if err != nil {
		return err
	}
	for _, r := range rows {
		if !r.Up {
			return &exitError{code: 1}
		}
	}
	return nil
}

// addConsumerMetrics reads the inbox counters of the consumers a /metrics
// endpoint reports into rep.
func addConsumerMetrics(ctx context.Context, rep *report.Status, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return usagef("--metrics %s: %v", redact(url), err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("--metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("--metrics %s: %s", redact(url), resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return fmt.Errorf("--metrics %s: %w", redact(url), err)
	}
	for name, set := range map[string]func(*report.Consumer, float64){
		"oncekit_inbox_processed_total":  func(c *report.Consumer, v float64) { c.Processed = &v },
		"oncekit_inbox_duplicates_total": func(c *report.Consumer, v float64) { c.Duplicates = &v },
	} {
		mf := families[name]
		if mf == nil {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "consumer" {
					set(consumerEntry(rep, l.GetValue()), m.GetCounter().GetValue())
				}
			}
		}
	}
	return nil
}

// consumerEntry returns rep's entry for name, adding it when missing.
func consumerEntry(rep *report.Status, name string) *report.Consumer {
	for i := range rep.Consumers {
		if rep.Consumers[i].Name == name {
			return &rep.Consumers[i]
		}
	}
	rep.Consumers = append(rep.Consumers, report.Consumer{Name: name})
	return &rep.Consumers[len(rep.Consumers)-1]
}

// addStandbyCopy reads the standby's copy of the slot at url into rep.
func addStandbyCopy(ctx context.Context, rep *report.Status, schema, slot, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("--standby-url: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	ob, err := outbox.New(&outbox.Config{Schema: schema, Slot: slot})
	if err != nil {
		return err
	}
	c, err := ob.StandbySlotStatus(ctx, conn, *rep.Outbox.Slot, 16<<20)
	if err != nil {
		return err
	}
	rep.Outbox.Slot.Standby = &c
	return nil
}
