// Command payments is a small payment service built the way oncekit means
// to be used, one binary with a role per process:
//
//	payments setup      create the tables (oncekit's and the service's) and the stream
//	payments api        POST /payments behind authentication and the Idempotency-Key edge (same transaction)
//	payments relay      publish the outbox to JetStream
//	payments consume    the ledger consumer: one ledger entry and two side effects per payment
//	                    (-replay-from: replay a window of the stream through it and exit)
//	payments dispatch   fire the side effects at the payment provider
//	payments provider   a fake payment provider that honours idempotency keys
//	payments demo       every role in one process, a few requests, and an account of each layer
//
// Every role reads DATABASE_URL, NATS_URL (a comma-separated list of servers)
// and PAYMENTS_SCHEMA from the environment; flags override them. The api
// admits bearer tokens from PAYMENTS_API_TOKENS ("token=caller,...", by
// default the demo's one caller) and scopes idempotency keys by caller. The
// flow:
//
//	client ──POST /payments (Authorization, Idempotency-Key)──► api: payment row + PaymentCreated outbox event, one tx
//	relay ──► JetStream (Nats-Msg-Id = event ID) ──► consume: ledger entry + provider.capture + receipt.email, one tx
//	dispatch ──► provider /capture and /email with Idempotency-Key = DeriveKey(payment, kind)
//
// Run `payments <role> -h` for a role's flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
)

// role is one of the binary's subcommands.
type role struct {
	name    string
	summary string
	run     func(ctx context.Context, cfg *config, args []string) error
}

// roles in the order a payment meets them, which is the order help lists
// them in.
var roles = []role{
	{"setup", "create the tables and the stream", onStream(runSetup)},
	{"api", "serve POST /payments behind the Idempotency-Key edge", onPool(runAPI)},
	{"relay", "publish the outbox to JetStream", onStream(runRelay)},
	{"consume", "run the ledger consumer", onStream(runConsume)},
	{"dispatch", "fire side effects at the provider", onPool(runDispatch)},
	{"provider", "serve the fake payment provider", runProvider},
	{"demo", "run every role in one process and tell what each layer did", runDemo},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := dispatchRole(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "payments:", err)
		if errors.As(err, new(usageError)) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func dispatchRole(ctx context.Context, args []string, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		printUsage(stderr)
		if len(args) == 0 {
			return usageError("a role is required")
		}
		return nil
	}
	i := slices.IndexFunc(roles, func(r role) bool { return r.name == args[0] })
	if i < 0 {
		printUsage(stderr)
		return usageError(fmt.Sprintf("unknown role %q", args[0]))
	}
	cfg, rest, err := parseConfig(args[0], args[1:], stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return usageError(err.Error())
	}
	return roles[i].run(ctx, cfg, rest)
}

// onPool adapts a role that works on the service's database: it opens the
// pool from cfg before the role runs and closes it after.
func onPool(run func(ctx context.Context, cfg *config, pool *pgxpool.Pool) error) func(context.Context, *config, []string) error {
	return func(ctx context.Context, cfg *config, _ []string) error {
		pool, err := cfg.openPool(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		return run(ctx, cfg, pool)
	}
}

// onStream adapts a role that works on the stream as well as the database:
// it also connects to NATS before the role runs, and closes the connection
// after.
func onStream(run func(ctx context.Context, cfg *config, pool *pgxpool.Pool, js jetstream.JetStream) error) func(context.Context, *config, []string) error {
	return onPool(func(ctx context.Context, cfg *config, pool *pgxpool.Pool) error {
		nc, js, err := cfg.connectNATS()
		if err != nil {
			return err
		}
		defer nc.Close()
		return run(ctx, cfg, pool, js)
	})
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: payments <role> [flags]\n\nroles:")
	for _, r := range roles {
		fmt.Fprintf(w, "  %-9s %s\n", r.name, r.summary)
	}
}

// usageError is a bad command line: exit code 2.
type usageError string

func (e usageError) Error() string { return string(e) }
