package main

import (
	"context"
	"fmt"
	"text/tabwriter"

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
	if len(args) == 0 {
		fs.Usage()
		return usagef("missing subcommand: list, parked or unpark")
	}
	sub := args[0]
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	switch sub {
	case "list", "parked", "unpark":
	default:
		return usagef("unknown subcommand %q: want list, parked or unpark", sub)
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
	ob, err := outbox.New(&outbox.Config{Schema: db.schema})
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
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tID\tSTATE\tPART\tKEY\tSUBJECT\tBYTES\tATTEMPTS\tCREATED\tLAST ERROR")
	for _, en := range entries {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\t%d\t%s\t%s\n", en.Seq, en.ID, en.State(), en.Partition,
			en.Key, en.Subject, size(en.PayloadSize), en.Attempts, en.CreatedAt.UTC().Format("2006-01-02 15:04:05Z"),
			oneLine(en.LastError, 60))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(entries) == 0 {
		fmt.Fprintln(e.stdout, "(none)")
	}
	return nil
}

func size(n *int) string {
	if n == nil {
		return "-"
	}
	return fmt.Sprint(*n)
}
