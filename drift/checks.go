package drift

import (
	"context"
	"strconv"
	"time"

	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/outbox"
)

// check is one query yielding a figure.
type check struct {
	name  string
	limit float64
	run   func(ctx context.Context, db pgsql.Querier) (Finding, error)
}

// scalar is a check whose SQL returns one number.
func scalar(name, sql string, limit float64, schema string, args ...any) check {
	q := pgsql.Render(sql, schema)
	return check{name: name, limit: limit, run: func(ctx context.Context, db pgsql.Querier) (Finding, error) {
		var v float64
		if err := db.QueryRow(ctx, q, args...).Scan(&v); err != nil {
			return Finding{}, err
		}
		return Finding{Check: name, Value: v, Limit: limit, Drift: v > limit}, nil
	}}
}

// backlog is a check on the outbox's unpublished rows, whose state follows
// from the relay's cursors: the outbox package holds that query.
func backlog(name string, limit float64, schema string, figure func(outbox.Backlog) float64) check {
	ob, err := outbox.New(&outbox.Config{Schema: schema})
	return check{name: name, limit: limit, run: func(ctx context.Context, db pgsql.Querier) (Finding, error) {
		if err != nil {
			return Finding{}, err
		}
		b, err := ob.Backlog(ctx, db)
		if err != nil {
			return Finding{}, err
		}
		v := figure(b)
		return Finding{Check: name, Value: v, Limit: limit, Drift: v > limit}, nil
	}}
}

func secs(d time.Duration) float64 { return d.Seconds() }

// builtins are the checks every deployment gets.
func builtins(c Config) []check {
	s := c.Schema
	return []check{
		backlog("outbox_backlog", float64(c.MaxOutboxBacklog), s,
			func(b outbox.Backlog) float64 { return float64(b.Pending) }),
		backlog("outbox_oldest_age_seconds", secs(c.MaxOutboxAge), s,
			func(b outbox.Backlog) float64 { return b.OldestAge.Seconds() }),
		scalar("outbox_parked",
			`SELECT count(*) FROM {schema}.outbox WHERE parked_at IS NOT NULL`, 0, s),
		scalar("effects_fired_past_lease",
			`SELECT count(*) FROM {schema}.side_effects
			  WHERE state = 'fired' AND lease_expires_at < now() - make_interval(secs => $1)`,
			0, s, secs(c.LeaseGrace)),
		scalar("effects_unknown",
			`SELECT count(*) FROM {schema}.side_effects WHERE state = 'unknown'`, 0, s),
		scalar("effects_pending_overdue",
			`SELECT count(*) FROM {schema}.side_effects
			  WHERE state = 'pending' AND next_attempt_at < now() - make_interval(secs => $1)`,
			0, s, secs(c.MaxPendingAge)),
		scalar("idempotency_in_progress_past_lease",
			`SELECT count(*) FROM {schema}.idempotency_keys
			  WHERE state = 'in_progress' AND locked_until < now() - make_interval(secs => $1)`,
			0, s, secs(c.LeaseGrace)),
		scalar("dead_letters",
			`SELECT count(*) FROM {schema}.dead_letters WHERE replayed_at IS NULL`, 0, s),
	}
}

// maxExamples bounds the violating rows a rule reports.
const maxExamples = 5

// ruleCheck counts a rule's rows and keeps a few as examples.
func ruleCheck(r Rule, schema string) check {
	q := `SELECT v::text, count(*) OVER () FROM (` + pgsql.Render(r.SQL, schema) + `) AS rule(v) LIMIT ` + strconv.Itoa(maxExamples)
	return check{name: r.Name, run: func(ctx context.Context, db pgsql.Querier) (Finding, error) {
		rows, err := db.Query(ctx, q)
		if err != nil {
			return Finding{}, err
		}
		defer rows.Close()
		f := Finding{Check: r.Name}
		for rows.Next() {
			var ex string
			var n int64
			if err := rows.Scan(&ex, &n); err != nil {
				return Finding{}, err
			}
			f.Examples = append(f.Examples, ex)
			f.Value = float64(n)
		}
		if err := rows.Err(); err != nil {
			return Finding{}, err
		}
		f.Drift = f.Value > 0
		return f, nil
	}}
}
