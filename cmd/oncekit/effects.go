package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/sideeffect"
)

const effectsUsage = `effects list [--state S] [--kind K] [--limit N] [--after ID] [--json]
       oncekit effects retry <id>... [--by NAME] [--reason TEXT]
       oncekit effects resolve <id> confirmed|failed --by NAME --reason TEXT [--ref REF]
       oncekit effects prune --older-than DURATION   (purge: its former name)`

// effectsSubcommands are list, retry, resolve and prune, each with flags of
// its own.
func effectsSubcommands(e *env, _ *flag.FlagSet, db *dbFlags) *subcommands {
	var (
		state, kind, by, reason, ref *string
		limit                        *int
		after                        *int64
		asJSON                       *bool
		olderThan                    *time.Duration
		byFlag                       envString
		// The checks set these.
		ledger    *sideeffect.Ledger
		ids       []int64
		resolveTo string
	)
	return &subcommands{
		flagsPerSubcommand: true,
		aliases:            map[string]string{"purge": "prune"},
		check: func([]string) error {
			var err error
			if ledger, err = sideeffect.New(&sideeffect.Config{Schema: db.schema()}); err != nil {
				return usagef("--schema: %v", err)
			}
			return nil
		},
		list: []subcommand{
			{name: "list", flags: func(fs *flag.FlagSet) {
				state = fs.String("state", "", "only effects in this state (pending, fired, confirmed, failed, unknown)")
				kind = fs.String("kind", "", "only effects of this kind")
				limit = fs.Int("limit", 100, "at most this many rows")
				after = fs.Int64("after", 0, "only IDs above this one (paging)")
				asJSON = fs.Bool("json", false, "a JSON array")
			}, check: func(pos []string) error {
				if len(pos) > 0 {
					return usagef("unexpected argument %q", pos[0])
				}
				if *state != "" && !sideeffect.State(*state).Valid() {
					return usagef("--state %q: want pending, fired, confirmed, failed or unknown", *state)
				}
				if *limit <= 0 {
					return usagef("--limit: %d must be positive", *limit)
				}
				return nil
			}, run: func(ctx context.Context, pool *pgxpool.Pool) error {
				rows, err := ledger.List(ctx, pool, sideeffect.Filter{State: sideeffect.State(*state), Kind: *kind, AfterID: *after, Limit: *limit})
				if err != nil {
					return err
				}
				return writeList(e.stdout, *asJSON, rows, effectsJSON, "ID\tSTATE\tKIND\tSOURCE\tATTEMPTS\tUPDATED\tDETAIL", func(r sideeffect.Row) string {
					return fmt.Sprintf("%d\t%s\t%s\t%s\t%d\t%s\t%s", r.ID, r.State, cell(r.Kind), cell(r.SourceID), r.Attempts, timestamp(r.UpdatedAt), cell(detail(r)))
				})
			}},
			{name: "retry", flags: func(fs *flag.FlagSet) {
				fs.Var(&byFlag, "by", "`NAME` of who decided, recorded on the effect (default: env USER, else operator)")
				reason = fs.String("reason", "retried by an operator", "why (recorded on the effect)")
			}, check: func(pos []string) error {
				if len(pos) == 0 {
					return usagef("retry needs at least one effect ID")
				}
				var err error
				ids, err = parseEffectIDs(pos)
				return err
			}, run: func(ctx context.Context, pool *pgxpool.Pool) error {
				by := byFlag.resolve(e, "USER", "operator")
				for _, id := range ids {
					if err := ledger.Retry(ctx, pool, id, sideeffect.Decision{By: by, Note: *reason}); err != nil {
						return err
					}
					fmt.Fprintf(e.stdout, "effect %d is pending again (same idempotency key)\n", id)
				}
				return nil
			}},
			{name: "resolve", flags: func(fs *flag.FlagSet) {
				by = fs.String("by", "", "who decided (required; recorded on the effect)")
				reason = fs.String("reason", "", "why (required; recorded on the effect)")
				ref = fs.String("ref", "", "the provider's reference, when resolving as confirmed")
			}, check: func(pos []string) error {
				if len(pos) != 2 {
					return usagef("usage: oncekit effects resolve <id> confirmed|failed --by NAME --reason TEXT")
				}
				if pos[1] != "confirmed" && pos[1] != "failed" {
					return usagef("resolve to %q: want confirmed or failed", pos[1])
				}
				if *by == "" || *reason == "" {
					return usagef("resolve needs --by and --reason: the decision is recorded")
				}
				resolveTo = pos[1]
				var err error
				ids, err = parseEffectIDs(pos[:1])
				return err
			}, run: func(ctx context.Context, pool *pgxpool.Pool) error {
				if err := ledger.Resolve(ctx, pool, ids[0], sideeffect.State(resolveTo),
					sideeffect.Decision{By: *by, Note: *reason, ProviderRef: *ref}); err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "effect %d resolved as %s by %s\n", ids[0], resolveTo, *by)
				return nil
			}},
			{name: "prune", flags: func(fs *flag.FlagSet) {
				olderThan = fs.Duration("older-than", 30*24*time.Hour, "delete confirmed and failed effects recorded longer ago than this")
			}, check: func(pos []string) error {
				if len(pos) > 0 {
					return usagef("unexpected argument %q", pos[0])
				}
				return nil
			}, run: func(ctx context.Context, pool *pgxpool.Pool) error {
				n, err := ledger.Prune(ctx, pool, time.Now().Add(-*olderThan), 1000)
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "deleted %d confirmed or failed effects\n", n)
				return nil
			}},
		},
	}
}

// parseEffectIDs parses the effect IDs of retry and resolve.
func parseEffectIDs(args []string) ([]int64, error) {
	ids := make([]int64, 0, len(args))
	for _, p := range args {
		id, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return nil, usagef("effect ID %q: not a number", p)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// detail is the one-line explanation shown by list.
func detail(r sideeffect.Row) string {
	var parts []string
	if r.ProviderRef != "" {
		parts = append(parts, "ref="+r.ProviderRef)
	}
	if r.ResolvedBy != "" {
		parts = append(parts, fmt.Sprintf("by %s: %s", r.ResolvedBy, r.ResolutionNote))
	}
	if r.LastError != "" && r.State != sideeffect.StateConfirmed {
		msg := r.LastError
		if len(msg) > 120 {
			msg = msg[:120] + "…"
		}
		parts = append(parts, msg)
	}
	return strings.Join(parts, "; ")
}
