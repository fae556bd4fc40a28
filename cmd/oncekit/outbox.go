package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/outbox"
)

// outboxSubcommands are list and parked, which list the outbox's rows,
// unpark, which gives parked messages back to the relay, and rebase, which
// moves the cursors after a restore into another cluster (outbox_rebase.go),
// and repartition, which changes the partition count online
// (outbox_repartition.go).
func outboxSubcommands(e *env, fs *flag.FlagSet, db *dbFlags) *subcommands {
	state := fs.String("state", "", "list: only rows in this state: pending, parked or published")
	limit := fs.Int("limit", 100, "most rows to list")
	all := fs.Bool("all", false, "unpark: every parked message")
	asJSON := fs.Bool("json", false, "list, parked: a JSON array")
	partitions := fs.Int("partitions", 0, "repartition: the new partition count (0: show the partitioning)")
	// The checks set these.
	var ob *outbox.Outbox
	var ids []uuid.UUID // unpark's
	list := func(ctx context.Context, pool *pgxpool.Pool, state outbox.State) error {
		entries, err := ob.List(ctx, pool, outbox.ListOptions{State: state, Limit: *limit})
		if err != nil {
			return err
		}
		return writeList(e.stdout, *asJSON, entries, outboxEntriesJSON,
			"SEQ\tID\tSTATE\tPART\tKEY\tSUBJECT\tBYTES\tATTEMPTS\tCREATED\tLAST ERROR", func(en outbox.Entry) string {
				return fmt.Sprintf("%d\t%s\t%s\t%d\t%s\t%s\t%s\t%d\t%s\t%s", en.Seq, en.ID, en.State(), en.Partition,
					cell(en.Key), cell(en.Subject), size(en.PayloadSize), en.Attempts, timestamp(en.CreatedAt), oneLine(en.LastError, 60))
			})
	}
	return &subcommands{
		check: func([]string) error {
			switch outbox.State(*state) {
			case "", outbox.StatePending, outbox.StateParked, outbox.StatePublished:
			default:
				return usagef("--state %q: want pending, parked or published", *state)
			}
			if *limit <= 0 {
				return usagef("--limit: %d must be positive", *limit)
			}
			var err error
			if ob, err = outbox.New(&outbox.Config{Schema: db.schema()}); err != nil {
				return usagef("%v", err)
			}
			return nil
		},
		list: []subcommand{
			{name: "list", check: noArguments, run: func(ctx context.Context, pool *pgxpool.Pool) error {
				return list(ctx, pool, outbox.State(*state))
			}},
			{name: "parked", check: noArguments, run: func(ctx context.Context, pool *pgxpool.Pool) error {
				return list(ctx, pool, outbox.StateParked)
			}},
			{name: "unpark", check: func(args []string) error {
				if *all == (len(args) > 0) {
					return usagef("unpark: give message IDs or --all")
				}
				for _, a := range args {
					id, err := uuid.Parse(a)
					if err != nil {
						return usagef("unpark: %q is not a message ID: %v", a, err)
					}
					ids = append(ids, id)
				}
				return nil
			}, run: func(ctx context.Context, pool *pgxpool.Pool) error {
				var n int64
				var err error
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
			}},
			outboxRebase(e, &ob),
			outboxRepartition(e, &ob, partitions),
		},
	}
}

func size(n *int) string {
	if n == nil {
		return "-"
	}
	return fmt.Sprint(*n)
}
