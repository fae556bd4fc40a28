package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/oncekit/oncekit/sideeffect"
)

func init() {
	register(&command{name: "effects", summary: "list side effects, retry them, resolve unknown ones (list | retry | resolve | prune)", run: runEffects})
}

const effectsUsage = `effects list [--state S] [--kind K] [--limit N] [--after ID] [--json]
       oncekit effects retry <id>... [--by NAME] [--reason TEXT]
       oncekit effects resolve <id> confirmed|failed --by NAME --reason TEXT [--ref REF]
       oncekit effects prune --older-than DURATION   (purge: its former name)`

func runEffects(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 {
		fmt.Fprintf(e.stderr, "usage: oncekit %s\n", effectsUsage)
		return usagef("missing subcommand: list, retry, resolve or prune")
	}
	if isHelp(args[0]) {
		fmt.Fprintf(e.stdout, "usage: oncekit %s\n\nRun `oncekit effects <subcommand> -h` for its flags.\n", effectsUsage)
		return nil
	}
	sub, args := args[0], args[1:]
	if sub == "purge" {
		sub = "prune" // its former name
	}
	fs := newFlagSet(e, "effects "+sub, effectsUsage)
	var db dbFlags
	db.register(fs, e)
	var byFlag envString
	var (
		state, kind, by, reason, ref *string
		limit                        *int
		after                        *int64
		asJSON                       *bool
		olderThan                    *time.Duration
	)
	switch sub {
	case "list":
		state = fs.String("state", "", "only effects in this state (pending, fired, confirmed, failed, unknown)")
		kind = fs.String("kind", "", "only effects of this kind")
		limit = fs.Int("limit", 100, "at most this many rows")
		after = fs.Int64("after", 0, "only IDs above this one (paging)")
		asJSON = fs.Bool("json", false, "a JSON array")
	case "retry":
		fs.Var(&byFlag, "by", "`NAME` of who decided, recorded on the effect (default: env USER, else operator)")
		reason = fs.String("reason", "retried by an operator", "why (recorded on the effect)")
	case "resolve":
		by = fs.String("by", "", "who decided (required; recorded on the effect)")
		reason = fs.String("reason", "", "why (required; recorded on the effect)")
		ref = fs.String("ref", "", "the provider's reference, when resolving as confirmed")
	case "prune":
		olderThan = fs.Duration("older-than", 30*24*time.Hour, "delete confirmed and failed effects recorded longer ago than this")
	default:
		return usagef("unknown subcommand %q: want list, retry, resolve or prune", sub)
	}
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if sub == "retry" {
		user := byFlag.resolve(e, "USER", "operator")
		by = &user
	}
	ledger, err := sideeffect.New(&sideeffect.Config{Schema: db.schema()})
	if err != nil {
		return usagef("--schema: %v", err)
	}
	switch sub {
	case "list":
		if len(pos) > 0 {
			return usagef("unexpected argument %q", pos[0])
		}
		if *state != "" && !sideeffect.State(*state).Valid() {
			return usagef("--state %q: want pending, fired, confirmed, failed or unknown", *state)
		}
		if *limit <= 0 {
			return usagef("--limit: %d must be positive", *limit)
		}
	case "retry":
		if len(pos) == 0 {
			return usagef("retry needs at least one effect ID")
		}
	case "resolve":
		if len(pos) != 2 {
			return usagef("usage: oncekit effects resolve <id> confirmed|failed --by NAME --reason TEXT")
		}
		if pos[1] != "confirmed" && pos[1] != "failed" {
			return usagef("resolve to %q: want confirmed or failed", pos[1])
		}
		if *by == "" || *reason == "" {
			return usagef("resolve needs --by and --reason: the decision is recorded")
		}
	case "prune":
		if len(pos) > 0 {
			return usagef("unexpected argument %q", pos[0])
		}
	}
	ids := make([]int64, 0, len(pos))
	if sub == "retry" || sub == "resolve" {
		idArgs := pos
		if sub == "resolve" {
			idArgs = pos[:1]
		}
		for _, p := range idArgs {
			id, err := strconv.ParseInt(p, 10, 64)
			if err != nil {
				return usagef("effect ID %q: not a number", p)
			}
			ids = append(ids, id)
		}
	}

	pool, err := db.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	switch sub {
	case "list":
		rows, err := ledger.List(ctx, pool, sideeffect.Filter{State: sideeffect.State(*state), Kind: *kind, AfterID: *after, Limit: *limit})
		if err != nil {
			return err
		}
		return writeList(e.stdout, *asJSON, rows, effectsJSON, "ID\tSTATE\tKIND\tSOURCE\tATTEMPTS\tUPDATED\tDETAIL", func(r sideeffect.Row) string {
			return fmt.Sprintf("%d\t%s\t%s\t%s\t%d\t%s\t%s", r.ID, r.State, r.Kind, r.SourceID, r.Attempts, timestamp(r.UpdatedAt), detail(r))
		})
	case "retry":
		for _, id := range ids {
			if err := ledger.Retry(ctx, pool, id, sideeffect.Decision{By: *by, Note: *reason}); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "effect %d is pending again (same idempotency key)\n", id)
		}
		return nil
	case "resolve":
		if err := ledger.Resolve(ctx, pool, ids[0], sideeffect.State(pos[1]),
			sideeffect.Decision{By: *by, Note: *reason, ProviderRef: *ref}); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "effect %d resolved as %s by %s\n", ids[0], pos[1], *by)
		return nil
	default: // prune
		n, err := ledger.Prune(ctx, pool, time.Now().Add(-*olderThan), 1000)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "deleted %d confirmed or failed effects\n", n)
		return nil
	}
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

// parseInterspersed parses flags anywhere among the positional arguments
// (`resolve 12 confirmed --by ana`), returning the positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parse(fs, args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}
