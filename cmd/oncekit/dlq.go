package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/oncekit/oncekit/inbox"
)

func init() {
	register(&command{name: "dlq", summary: "list, show, replay or prune the inbox's dead letters (list | show | replay | prune)", run: runDLQ})
}

const dlqUsage = `dlq <subcommand> [flags] [ID...]

subcommands:
  list                 pending dead letters (--all includes replayed ones)
  show ID              one dead letter with its payload and headers
  replay ID...         republish with the original ID to the broker the consumer reads and mark
                       replayed: NATS JetStream (default; Nats-Msg-Id), or --broker rabbitmq
                       (--amqp-url) or --broker redis (--redis-url), through broker/wmbroker
  prune                delete dead letters: --id, --older-than, --replayed or --all
                       (purge is its former name, still accepted)

flags go before the IDs`

func runDLQ(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "dlq", dlqUsage)
	var db dbFlags
	var nf natsFlags
	var rf replayFlags
	db.register(fs, e)
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
	sub, err := parseSubcommand(fs, args, "list, show, replay or prune")
	if err != nil {
		return err
	}
	if sub == "purge" {
		sub = "prune" // its former name
	}
	ids, err := parseIDs(fs.Args())
	if err != nil {
		return err
	}
	if err := nonNegative(fs, "older-than"); err != nil {
		return err
	}
	if *limit <= 0 {
		return usagef("--limit: %d must be positive", *limit)
	}
	store, err := inbox.NewStore(db.schema())
	if err != nil {
		return usagef("--schema: %v", err)
	}
	switch sub {
	case "list", "show", "replay", "prune":
	default:
		return usagef("unknown subcommand %q: want list, show, replay or prune", sub)
	}
	if (sub == "show" || sub == "replay") && len(ids) == 0 {
		return usagef("dlq %s: at least one dead letter ID is required", sub)
	}
	if sub == "replay" {
		if err := rf.validate(); err != nil {
			return err
		}
	}
	if sub == "prune" && *id == 0 && *olderThan == 0 && !*replayed && !*all {
		return usagef("dlq prune: say what to delete: --id, --older-than, --replayed or --all")
	}
	pool, err := db.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()

	switch sub {
	case "list":
		dls, err := store.ListDeadLetters(ctx, pool, inbox.DeadLetterFilter{Consumer: *consumer, IncludeReplayed: *all, Limit: *limit})
		if err != nil {
			return err
		}
		return writeList(e.stdout, *asJSON, dls, deadLettersJSON, "ID\tCONSUMER\tMESSAGE ID\tSUBJECT\tATTEMPTS\tCREATED\tREPLAYED\tREASON", func(dl inbox.DeadLetter) string {
			rep := "-"
			if dl.ReplayedAt != nil {
				rep = timestamp(*dl.ReplayedAt)
			}
			return fmt.Sprintf("%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s", dl.ID, dl.Consumer, orDash(dl.MessageID), dl.Subject,
				dl.Attempts, timestamp(dl.CreatedAt), rep, oneLine(dl.Reason, 80))
		})
	case "show":
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
	case "replay":
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
			fmt.Fprintf(e.stdout, "replayed %d (message %s) to %s on %s\n", dl.ID, orDash(dl.MessageID), dl.Subject, brokerName(rf.broker))
		}
		return failed
	default: // prune
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
		dl.ID, dl.Consumer, orDash(dl.MessageID), dl.Subject, dl.Attempts, dl.CreatedAt.UTC().Format(time.RFC3339))
	if dl.ReplayedAt != nil {
		fmt.Fprintf(e.stdout, "replayed:   %s\n", dl.ReplayedAt.UTC().Format(time.RFC3339))
	}
	fmt.Fprintf(e.stdout, "reason:     %s\nheaders:\n", dl.Reason)
	for _, k := range slices.Sorted(maps.Keys(dl.Headers)) {
		fmt.Fprintf(e.stdout, "  %s: %s\n", k, strings.Join(dl.Headers[k], ", "))
	}
	if utf8.Valid(dl.Payload) {
		fmt.Fprintf(e.stdout, "payload (%d bytes):\n%s\n", len(dl.Payload), dl.Payload)
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
