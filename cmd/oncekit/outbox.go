package main

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/oncekit/oncekit/outbox"
)

func init() {
	register(&command{name: "outbox", summary: "inspect the outbox and unpark messages (list | parked | unpark)", run: runOutbox})
}

func runOutbox(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "outbox", "outbox list|parked|unpark [flags] [ID...]")
	var db dbFlags
	db.register(fs, e)
	state := fs.String("state", "", "list: only rows in this state: pending, parked or published")
	limit := fs.Int("limit", 100, "most rows to list")
	all := fs.Bool("all", false, "unpark: every parked message")
	asJSON := fs.Bool("json", false, "list, parked: a JSON array")
	sub, err := parseSubcommand(fs, args, "list, parked or unpark")
	if err != nil {
		return err
	}
	switch sub {
	case "list", "parked", "unpark":
	default:
		return usagef("unknown subcommand %q: want list, parked or unpark", sub)
	}
	switch outbox.State(*state) {
	case "", outbox.StatePending, outbox.StateParked, outbox.StatePublished:
	default:
		return usagef("--state %q: want pending, parked or published", *state)
	}
	if *limit <= 0 {
		return usagef("--limit: %d must be positive", *limit)
	}
	var ids []uuid.UUID
	if sub == "unpark" {
		if *all == (fs.NArg() > 0) {
			return usagef("unpark: give message IDs or --all")
		}
		for _, a := range fs.Args() {
			id, err := uuid.Parse(a)
			if err != nil {
				return usagef("unpark: %q is not a message ID: %v", a, err)
			}
			ids = append(ids, id)
		}
	} else if fs.NArg() > 0 {
		return usagef("unexpected arguments: %v", fs.Args())
	}
	ob, err := outbox.New(&outbox.Config{Schema: db.schema()})
	if err != nil {
		return usagef("%v", err)
	}
	pool, err := db.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()

	if sub == "unpark" {
		var n int64
		if *all {
			n, err = ob.UnparkAll(ctx, pool)
		} else {
			n, err = ob.Unpark(ctx, pool, ids...)
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "unparked %d message(s)\n", n)
		return nil
	}
	opts := outbox.ListOptions{State: outbox.State(*state), Limit: *limit}
	if sub == "parked" {
		opts.State = outbox.StateParked
	}
	entries, err := ob.List(ctx, pool, opts)
	if err != nil {
		return err
	}
	return writeList(e.stdout, *asJSON, entries, outboxEntriesJSON,
		"SEQ\tID\tSTATE\tPART\tKEY\tSUBJECT\tBYTES\tATTEMPTS\tCREATED\tLAST ERROR", func(en outbox.Entry) string {
			return fmt.Sprintf("%d\t%s\t%s\t%d\t%s\t%s\t%s\t%d\t%s\t%s", en.Seq, en.ID, en.State(), en.Partition,
				en.Key, en.Subject, size(en.PayloadSize), en.Attempts, timestamp(en.CreatedAt), oneLine(en.LastError, 60))
		})
}

func size(n *int) string {
	if n == nil {
		return "-"
	}
	return fmt.Sprint(*n)
}
