package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
)

// command is one `oncekit` subcommand. Each lives in its own file; commands
// lists them.
type command struct {
	name    string
	summary string
	// run executes the command; args excludes the command name. For a
	// command made of subcommands it is runSubcommands.
	run func(ctx context.Context, e *env, args []string) error
	// usage and subcommands describe a command made of subcommands on
	// oncekit's tables. usage follows "usage: oncekit" in its help;
	// subcommands declares the command's flags on fs, where the database's
	// are already, and returns the subcommands.
	usage       string
	subcommands func(e *env, fs *flag.FlagSet, db *dbFlags) *subcommands
}

// commands are oncekit's commands by name.
var commands = byName([]*command{
	{name: "console", summary: "serve the operator console: every layer on one page per layer, the chain of one operation, fixes", run: runConsole},
	{name: "dispatch", summary: "run the side-effect dispatcher for kinds mapped to webhook endpoints", run: runDispatch},
	{name: "dlq", summary: "list, show, replay or prune the inbox's dead letters (list | show | replay | prune)", usage: dlqUsage, subcommands: dlqSubcommands},
	{name: "drift", summary: "check that the chain held: lag, stuck, failed and unknown effects, dead letters, rules", run: runDrift},
	{name: "edge", summary: "list the edge's unknown and stuck records, resolve them (list | resolve)", usage: edgeUsage, subcommands: edgeSubcommands},
	{name: "effects", summary: "list side effects, retry them, resolve unknown ones (list | retry | resolve | prune)", usage: effectsUsage, subcommands: effectsSubcommands},
	{name: "migrate", summary: "apply, list or print the schema migrations; grant a runtime role its privileges (up | status | sql | grant)", usage: migrateUsage, subcommands: migrateSubcommands},
	{name: "outbox", summary: "inspect the outbox, unpark messages, rebase after a cluster move, repartition (list | parked | unpark | rebase | repartition)", usage: "outbox list|parked|unpark|rebase|repartition [flags] [ID...]", subcommands: outboxSubcommands},
	{name: "relay", summary: "run the outbox relay daemon (outbox → JetStream)", run: runRelay},
	{name: "status", summary: "one screen: outbox backlog and owners, consumers, dead letters, effects, edge records", run: runStatus},
})

// byName indexes cmds by name, setting the run of those made of
// subcommands.
func byName(cmds []*command) map[string]*command {
	m := make(map[string]*command, len(cmds))
	for _, c := range cmds {
		if c.subcommands != nil {
			c.run = c.runSubcommands
		}
		m[c.name] = c
	}
	return m
}

func printHelp(w io.Writer) {
	fmt.Fprintln(w, "usage: oncekit <command> [flags]\n\ncommands:")
	for _, n := range slices.Sorted(maps.Keys(commands)) {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun `oncekit <command> -h` for a command's flags. Common environment:\n"+
		"  DATABASE_URL    PostgreSQL connection string\n"+
		"  NATS_URL        NATS server URL\n"+
		"  AMQP_URL        RabbitMQ URL (dlq replay --broker rabbitmq)\n"+
		"  REDIS_URL       Redis URL (dlq replay --broker redis)\n"+
		"  ONCEKIT_SCHEMA  schema of oncekit's tables (default oncekit)")
}
