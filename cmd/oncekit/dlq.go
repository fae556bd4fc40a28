package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/cmd/oncekit/internal/printable"
	"github.com/oncekit/oncekit/inbox"
)

const dlqUsage = `dlq <subcommand> [flags] [ID...]

subcommands:
  list                 pending dead letters (--all includes replayed ones)
  show ID              one dead letter with its payload and headers
  replay ID...         republish with the original ID to the broker the consumer reads and mark
                       replayed: NATS JetStream (default; Nats-Msg-Id), or --broker rabbitmq
                       (--amqp-url) or --broker redis (--redis-url), through watermill/asbroker
  prune                delete dead letters: --id, --older-than, --replayed or --all
                       (purge is its former name, still accepted)

flags go before the IDs`

// dlqSubcommands are list, show, replay and prune. The IDs of dead letters
// go after the flags.
func dlqSubcommands(e *env, fs *flag.FlagSet, db *dbFlags) *subcommands {
	var nf natsFlags
	var rf replayFlags
	nf.register(fs, e)
	rf.register(fs, e, &nf)
	consumer := fs.String("consumer", "", "only this consumer's dead letters")
	all := fs.Bool("all", false, "list: include replayed; prune: delete every selected row")
	limit := fs.Int("limit", 100, "list: at most this many rows")
	assignID := fs.Bool("assign-id", false, "replay: give a message without a valid ID a deterministic one")
	id := fs.Int64("id", 0, "prune: only this dead letter")
	olderThan := fs.Duration("older-than", 0, "prune: only rows older than this")
	replayed := fs.Bool("replayed", false, "prune: only rows already replayed")
	asJSON := fs.Bool("json", false, "list, show: JSON (list: an array)")
	// check sets these.
	var ids []int64
	var store *inbox.Store
	needIDs := func(sub string) error {
		if len(ids) == 0 {
			return usagef("dlq %s: at least one dead letter ID is required", sub)
		}
		return nil
	}
	return &subcommands{
		aliases: map[string]string{"purge": "prune"},
		check: func(args []string) error {
			var err error
			if ids, err = parseIDs(args); err != nil {
				return err
			}
			if err := nonNegative(fs, "older-than"); err != nil {
				return err
			}
			if *limit <= 0 {
				return usagef("--limit: %d must be positive", *limit)
			}
			if store, err = inbox.NewStore(db.schema()); err != nil {
				return usagef("--schema: %v", err)
			}
			return nil
		},
		list: []subcommand{
			{name: "list", run: func(ctx context.Context, pool *pgxpool.Pool) error {
				dls, err := store.ListDeadLetters(ctx, pool, inbox.DeadLetterFilter{Consumer: *consumer, IncludeReplayed: *all, Limit: *limit})
				if err != nil {
					return err
				}
				return writeList(e.stdout, *asJSON, dls, deadLettersJSON, "ID\tCONSUMER\tMESSAGE ID\tSUBJECT\tATTEMPTS\tCREATED\tREPLAYED\tREASON", func(dl inbox.DeadLetter) string {
					rep := "-"
					if dl.ReplayedAt != nil {
						rep = timestamp(*dl.ReplayedAt)
					}
					return fmt.Sprintf("%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s", dl.ID, cell(dl.Consumer), orDash(cell(dl.MessageID)), cell(dl.Subject),
						dl.Attempts, timestamp(dl.CreatedAt), rep, oneLine(dl.Reason, 80))
				})
			}},
			{name: "show", check: func([]string) error { return needIDs("show") }, run: func(ctx context.Context, pool *pgxpool.Pool) error {
				var shown []inbox.DeadLetter
				for _, n := range ids {
					dl, err := store.GetDeadLetter(ctx, pool, n)
					if err != nil {
						return fmt.Errorf("dead letter %d: %w", n, err)
					}
					shown = append(shown, dl)
				}
				if *asJSON {
					return writeJSON(e.stdout, deadLettersJSON(shown))
				}
				for _, dl := range shown {
					printDeadLetter(e, dl)
				}
				return nil
			}},
			{name: "replay", check: func([]string) error {
				if err := needIDs("replay"); err != nil {
					return err
				}
				return rf.validate()
			}, run: func(ctx context.Context, pool *pgxpool.Pool) error {
				pub, closePub, err := rf.open(ctx)
				if err != nil {
					return err
				}
				defer closePub()
				var failed error
				for _, n := range ids {
					dl, err := store.Replay(ctx, pool, pub, n, inbox.ReplayOptions{AssignID: *assignID})
					if err != nil {
						failed = errors.Join(failed, fmt.Errorf("dead letter %d: %w", n, err))
						continue
					}
					fmt.Fprintf(e.stdout, "replayed %d (message %s) to %s on %s\n", dl.ID, orDash(cell(dl.MessageID)), cell(dl.Subject), brokerName(rf.broker))
				}
				return failed
			}},
			{name: "prune", check: func([]string) error {
				if *id == 0 && *olderThan == 0 && !*replayed && !*all {
					return usagef("dlq prune: say what to delete: --id, --older-than, --replayed or --all")
				}
				return nil
			}, run: func(ctx context.Context, pool *pgxpool.Pool) error {
				var before time.Time
				if *olderThan > 0 {
					before = time.Now().Add(-*olderThan)
				}
				n, err := store.PruneDeadLetters(ctx, pool, inbox.PruneFilter{Consumer: *consumer, ID: *id, Before: before, ReplayedOnly: *replayed})
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "deleted %d dead letters\n", n)
				return nil
			}},
		},
	}
}

func parseIDs(args []string) ([]int64, error) {
	var ids []int64
	for _, a := range args {
		n, err := strconv.ParseInt(a, 10, 64)
		if err != nil || n <= 0 {
			return nil, usagef("%q is not a dead letter ID (flags go before the IDs)", a)
		}
		ids = append(ids, n)
	}
	return ids, nil
}

func printDeadLetter(e *env, dl inbox.DeadLetter) {
	fmt.Fprintf(e.stdout, "id:         %d\nconsumer:   %s\nmessage id: %s\nsubject:    %s\nattempts:   %d\ncreated:    %s\n",
		dl.ID, cell(dl.Consumer), orDash(cell(dl.MessageID)), cell(dl.Subject), dl.Attempts, dl.CreatedAt.UTC().Format(time.RFC3339))
	if dl.ReplayedAt != nil {
		fmt.Fprintf(e.stdout, "replayed:   %s\n", dl.ReplayedAt.UTC().Format(time.RFC3339))
	}
	fmt.Fprintf(e.stdout, "reason:     %s\nheaders:\n", cell(dl.Reason))
	for _, k := range slices.Sorted(maps.Keys(dl.Headers)) {
		fmt.Fprintf(e.stdout, "  %s: %s\n", cell(k), cell(strings.Join(dl.Headers[k], ", ")))
	}
	if utf8.Valid(dl.Payload) {
		fmt.Fprintf(e.stdout, "payload (%d bytes):\n%s\n", len(dl.Payload), printable.Text(string(dl.Payload)))
	} else {
		fmt.Fprintf(e.stdout, "payload (%d bytes, binary):\n%x\n", len(dl.Payload), dl.Payload)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
