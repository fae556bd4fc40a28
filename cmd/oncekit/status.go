package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/outbox"
)

const statusUsage = `status [--json] [--metrics URL ...]

Reads every figure in one read-only transaction, each through an index or
under a limit. Inbox processed and duplicate counts live in the consumers'
metrics: give their /metrics URLs with --metrics to show them.`

// statusReport is everything `oncekit status` shows.
type statusReport struct {
	Schema      string            `json:"schema"`
	At          time.Time         `json:"at"`
	Outbox      statusOutbox      `json:"outbox"`
	Consumers   []statusConsumer  `json:"consumers"`
	Effects     []statusEffects   `json:"effects"`
	Idempotency statusIdempotency `json:"idempotency"`
}

type statusOutbox struct {
	statusBacklog
	Parked     int64             `json:"parked"`
	Ranges     []statusRange     `json:"partition_ranges"`
	Nodes      []statusNode      `json:"relay_nodes"`
	ParkedKeys []statusParkedKey `json:"parked_keys"`
}

// statusBacklog is the unpublished rows of the outbox or of some of its
// partitions: how many, and the age of the oldest.
type statusBacklog struct {
	Backlog          int64   `json:"backlog"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
}

// add counts b's rows in s.
func (s *statusBacklog) add(b statusBacklog) {
	s.Backlog += b.Backlog
	s.OldestAgeSeconds = max(s.OldestAgeSeconds, b.OldestAgeSeconds)
}

// statusRange is a run of consecutive partitions with the same owner and
// lease state.
type statusRange struct {
	First        int     `json:"first"`
	Last         int     `json:"last"`
	Owner        string  `json:"owner"`
	LeaseSeconds float64 `json:"lease_seconds"` // left (>0) or since expiry (<0)
	statusBacklog
}

type statusNode struct {
	ID                  string  `json:"id"`
	HeartbeatAgeSeconds float64 `json:"heartbeat_age_seconds"`
}

type statusParkedKey struct {
	Key              string  `json:"key"`
	Messages         int64   `json:"messages"`
	ParkedAgeSeconds float64 `json:"parked_age_seconds"`
}

type statusConsumer struct {
	Name                 string   `json:"name"`
	ClaimsLastHour       int64    `json:"claims_last_hour"`
	Processed            *float64 `json:"processed_total"`
	Duplicates           *float64 `json:"duplicates_total"`
	DeadLetters          int64    `json:"dead_letters"`
	OldestDeadAgeSeconds float64  `json:"oldest_dead_letter_age_seconds"`
}

type statusEffects struct {
	Kind      string `json:"kind"`
	Pending   int64  `json:"pending"`
	Overdue   int64  `json:"pending_overdue"`
	Fired     int64  `json:"fired"`
	PastLease int64  `json:"fired_past_lease"`
	Unknown   int64  `json:"unknown"`
	Confirmed int64  `json:"confirmed_recent"`
	Failed    int64  `json:"failed_recent"`
}

type statusIdempotency struct {
	InProgress          int64 `json:"in_progress"`
	InProgressPastLease int64 `json:"in_progress_past_lease"`
	Completed           int64 `json:"completed"`
	Unknown             int64 `json:"unknown"`
}

// statusLimit bounds the rows of each list.
const statusLimit = 50

func runStatus(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "status", statusUsage)
	var db dbFlags
	db.register(fs, e)
	asJSON := fs.Bool("json", false, "print the figures as JSON")
	overdue := fs.Duration("overdue", 5*time.Minute, "a pending effect this far past due counts as overdue")
	recent := fs.Duration("recent", 24*time.Hour, "confirmed and failed effects are counted over this window")
	metricsURLs := &listFlag[string]{parse: func(v string) (string, error) {
		if !strings.HasPrefix(v, "http://") && !strings.HasPrefix(v, "https://") {
			return "", fmt.Errorf("want an http(s) URL")
		}
		return v, nil
	}}
	fs.Var(metricsURLs, "metrics", "a consumer's /metrics `URL`, for its processed and duplicate counts (repeatable)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected arguments: %v", fs.Args())
	}
	if err := nonNegative(fs, "overdue", "recent"); err != nil {
		return err
	}
	pool, err := db.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	var rep statusReport
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		rep, err = readStatus(ctx, tx, db.schema(), *overdue, *recent)
		return err
	})
	if err != nil {
		return err
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

// readStatus reads every figure in tx, whose now() is the report's time.
func readStatus(ctx context.Context, tx pgx.Tx, schema string, overdue, recent time.Duration) (statusReport, error) {
	rep := statusReport{Schema: schema, Consumers: []statusConsumer{}, Effects: []statusEffects{}}
	q := func(sql string) string { return pgsql.Render(sql, schema) }
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&rep.At); err != nil {
		return rep, err
	}
	ob, err := outbox.New(&outbox.Config{Schema: schema})
	if err != nil {
		return rep, err
	}
	backlog, err := ob.BacklogByPartition(ctx, tx)
	if err != nil {
		return rep, err
	}
	byPart := map[int]statusBacklog{}
	for _, b := range backlog {
		pb := statusBacklog{Backlog: b.Pending, OldestAgeSeconds: b.OldestAge.Seconds()}
		byPart[b.Partition] = pb
		rep.Outbox.add(pb)
	}
	// relay_partitions has one row per partition: small.
	rows, err := tx.Query(ctx, q(`SELECT partition, coalesce(owner, ''),
		CASE WHEN isfinite(expires_at) THEN extract(epoch FROM expires_at - now())::float8 ELSE 0 END
		FROM {schema}.relay_partitions ORDER BY partition`))
	if err != nil {
		return rep, err
	}
	var parts []statusRange
	parts, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (statusRange, error) {
		var s statusRange
		err := r.Scan(&s.First, &s.Owner, &s.LeaseSeconds)
		s.Last = s.First
		if s.Owner == "" {
			s.LeaseSeconds = 0
		}
		s.statusBacklog = byPart[s.First]
		return s, err
	})
	if err != nil {
		return rep, err
	}
	rep.Outbox.Ranges = groupRanges(parts)
	rows, err = tx.Query(ctx, q(`SELECT id, extract(epoch FROM now() - heartbeat_at)::float8 FROM {schema}.relay_nodes
		ORDER BY id LIMIT $1`), statusLimit)
	if err != nil {
		return rep, err
	}
	if rep.Outbox.Nodes, err = pgx.CollectRows(rows, pgx.RowToStructByPos[statusNode]); err != nil {
		return rep, err
	}
	// Parked rows are in the partial index outbox_blocked.
	if err := tx.QueryRow(ctx, q(`SELECT count(*) FROM {schema}.outbox o
		WHERE (o.parked_at IS NOT NULL OR o.next_attempt_at IS NOT NULL) AND o.parked_at IS NOT NULL`)).Scan(&rep.Outbox.Parked); err != nil {
		return rep, err
	}
	rows, err = tx.Query(ctx, q(`SELECT o.ordering_key, count(*), extract(epoch FROM now() - min(o.parked_at))::float8
		FROM {schema}.outbox o WHERE (o.parked_at IS NOT NULL OR o.next_attempt_at IS NOT NULL) AND o.parked_at IS NOT NULL
		GROUP BY o.ordering_key ORDER BY min(o.parked_at), o.ordering_key LIMIT $1`), statusLimit)
	if err != nil {
		return rep, err
	}
	if rep.Outbox.ParkedKeys, err = pgx.CollectRows(rows, pgx.RowToStructByPos[statusParkedKey]); err != nil {
		return rep, err
	}
	if rep.Consumers, err = readConsumers(ctx, tx, q); err != nil {
		return rep, err
	}
	if rep.Effects, err = readEffects(ctx, tx, q, overdue, recent); err != nil {
		return rep, err
	}
	// Each count reads a partial index: in-progress claims under a lease,
	// completed records (idempotency_keys_expired), unknown ones
	// (idempotency_keys_unsettled).
	err = tx.QueryRow(ctx, q(`SELECT
		(SELECT count(*) FROM {schema}.idempotency_keys WHERE state = 'in_progress' AND locked_until IS NOT NULL),
		(SELECT count(*) FROM {schema}.idempotency_keys WHERE state = 'in_progress' AND locked_until IS NOT NULL AND locked_until < now()),
		(SELECT count(*) FROM {schema}.idempotency_keys WHERE state = 'completed' AND expires_at > '-infinity'),
		(SELECT count(*) FROM {schema}.idempotency_keys WHERE state = 'unknown')`)).
		Scan(&rep.Idempotency.InProgress, &rep.Idempotency.InProgressPastLease, &rep.Idempotency.Completed, &rep.Idempotency.Unknown)
	return rep, err
}

// groupRanges merges consecutive partitions with the same owner and lease
// state (held, expired or free).
func groupRanges(parts []statusRange) []statusRange {
	out := []statusRange{}
	state := func(s statusRange) string {
		switch {
		case s.Owner == "":
			return "free"
		case s.LeaseSeconds <= 0:
			return "expired"
		}
		return "held"
	}
	for _, p := range parts {
		if n := len(out); n > 0 && out[n-1].Last+1 == p.First && out[n-1].Owner == p.Owner && state(out[n-1]) == state(p) {
			r := &out[n-1]
			r.Last = p.First
			r.LeaseSeconds = min(r.LeaseSeconds, p.LeaseSeconds)
			r.add(p.statusBacklog)
			continue
		}
		out = append(out, p)
	}
	return out
}

// readConsumers lists the consumers with claims in the last hour (a range
// of the BRIN index on processed_at) or with pending dead letters.
func readConsumers(ctx context.Context, tx pgx.Tx, q func(string) string) ([]statusConsumer, error) {
	rows, err := tx.Query(ctx, q(`WITH claims AS (
			SELECT consumer, count(*) AS n FROM {schema}.processed_messages
			WHERE processed_at >= now() - interval '1 hour' GROUP BY consumer),
		dead AS (
			SELECT consumer, count(*) AS n, extract(epoch FROM now() - min(created_at))::float8 AS oldest
			FROM {schema}.dead_letters WHERE replayed_at IS NULL GROUP BY consumer)
		SELECT coalesce(c.consumer, d.consumer), coalesce(c.n, 0), coalesce(d.n, 0), coalesce(d.oldest, 0)
		FROM claims c FULL JOIN dead d ON d.consumer = c.consumer
		ORDER BY 1 LIMIT $1`), statusLimit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (statusConsumer, error) {
		var c statusConsumer
		err := r.Scan(&c.Name, &c.ClaimsLastHour, &c.DeadLetters, &c.OldestDeadAgeSeconds)
		return c, err
	})
}

// readEffects counts effects by kind and state: the live ones (pending,
// fired, unknown) through the due index, the settled ones recorded within
// recent through the BRIN index on created_at.
func readEffects(ctx context.Context, tx pgx.Tx, q func(string) string, overdue, recent time.Duration) ([]statusEffects, error) {
	rows, err := tx.Query(ctx, q(`WITH live AS (
			SELECT kind,
				count(*) FILTER (WHERE state = 'pending') AS pending,
				count(*) FILTER (WHERE state = 'pending' AND next_attempt_at < now() - make_interval(secs => $1)) AS overdue,
				count(*) FILTER (WHERE state = 'fired') AS fired,
				count(*) FILTER (WHERE state = 'fired' AND lease_expires_at < now()) AS past_lease,
				count(*) FILTER (WHERE state = 'unknown') AS unknown
			FROM {schema}.side_effects WHERE next_attempt_at IS NOT NULL GROUP BY kind),
		settled AS (
			SELECT kind, count(*) FILTER (WHERE state = 'confirmed') AS confirmed, count(*) FILTER (WHERE state = 'failed') AS failed
			FROM {schema}.side_effects WHERE created_at >= now() - make_interval(secs => $2) AND state IN ('confirmed', 'failed')
			GROUP BY kind)
		SELECT coalesce(l.kind, s.kind), coalesce(l.pending, 0), coalesce(l.overdue, 0), coalesce(l.fired, 0),
			coalesce(l.past_lease, 0), coalesce(l.unknown, 0), coalesce(s.confirmed, 0), coalesce(s.failed, 0)
		FROM live l FULL JOIN settled s ON s.kind = l.kind ORDER BY 1 LIMIT $3`), overdue.Seconds(), recent.Seconds(), statusLimit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[statusEffects])
}

// addConsumerMetrics reads the inbox counters of the consumers a /metrics
// endpoint reports into rep.
func addConsumerMetrics(ctx context.Context, rep *statusReport, url string) error {
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
	for name, set := range map[string]func(*statusConsumer, float64){
		"oncekit_inbox_processed_total":  func(c *statusConsumer, v float64) { c.Processed = &v },
		"oncekit_inbox_duplicates_total": func(c *statusConsumer, v float64) { c.Duplicates = &v },
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
func consumerEntry(rep *statusReport, name string) *statusConsumer {
	for i := range rep.Consumers {
		if rep.Consumers[i].Name == name {
			return &rep.Consumers[i]
		}
	}
	rep.Consumers = append(rep.Consumers, statusConsumer{Name: name})
	return &rep.Consumers[len(rep.Consumers)-1]
}
