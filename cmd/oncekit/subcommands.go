package main

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// subcommands is the table of a command made of subcommands on oncekit's
// tables, such as `oncekit outbox list`. runSubcommands parses the command
// line, checks it, and runs the subcommand named on a pool it opens and
// closes.
type subcommands struct {
	// list holds the subcommands in the order the usage errors name them.
	list []subcommand
	// aliases maps a subcommand's former name to its name.
	aliases map[string]string
	// flagsPerSubcommand gives each subcommand a flag set of its own, named
	// after it, whose flags may come anywhere among the positional
	// arguments; the command's help then lists no flags. Otherwise the
	// subcommands share the command's flags, which go between the
	// subcommand and the positional arguments.
	flagsPerSubcommand bool
	// check, when set, validates what every subcommand takes once the flags
	// are parsed; args are the positional arguments. It runs before the
	// subcommand's own check.
	check func(args []string) error
	// tablesOptional opens the pool without checking that oncekit's tables
	// exist (migrate creates them).
	tablesOptional bool
}

// subcommand is one subcommand of a command.
type subcommand struct {
	name string
	// flags, with flagsPerSubcommand, declares the subcommand's flags.
	flags func(fs *flag.FlagSet)
	// check, when set, validates the subcommand's positional arguments and
	// flags once they are parsed, before anything connects.
	check func(args []string) error
	// offline marks a subcommand that needs no connection: run gets a nil
	// pool.
	offline bool
	run     func(ctx context.Context, pool *pgxpool.Pool) error
}

// runSubcommands runs c, a command made of subcommands; args excludes the
// command name.
func (c *command) runSubcommands(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, c.name, c.usage)
	var db dbFlags
	db.register(fs, e)
	subs := c.subcommands(e, fs, &db)
	var sub subcommand
	var err error
	if subs.flagsPerSubcommand {
		sub, args, err = subs.parseOwnFlags(e, fs, c.usage, args)
	} else {
		sub, args, err = subs.parse(fs, args)
	}
	if err != nil {
		return err
	}
	for _, check := range []func([]string) error{subs.check, sub.check} {
		if check == nil {
			continue
		}
		if err := check(args); err != nil {
			return err
		}
	}
	if sub.offline {
		return sub.run(ctx, nil)
	}
	pool, err := db.openWith(ctx, !subs.tablesOptional)
	if err != nil {
		return err
	}
	defer pool.Close()
	return sub.run(ctx, pool)
}

// parse reads the subcommand from args, then the command's flags into fs,
// and returns the positional arguments after them.
func (s *subcommands) parse(fs *flag.FlagSet, args []string) (subcommand, []string, error) {
	name, err := parseSubcommand(fs, args, s.names())
	if err != nil {
		return subcommand{}, nil, err
	}
	sub, err := s.find(name)
	return sub, fs.Args(), err
}

// parseOwnFlags reads the subcommand from args, then declares its flags on
// fs and parses them from among the positional arguments, which it returns.
// No subcommand prints the usage; a help word prints it and points to the
// subcommands' help for the flags.
func (s *subcommands) parseOwnFlags(e *env, fs *flag.FlagSet, usage string, args []string) (subcommand, []string, error) {
	if len(args) == 0 {
		fmt.Fprintf(e.stderr, "usage: oncekit %s\n", usage)
		return subcommand{}, nil, usagef("missing subcommand: %s", s.names())
	}
	if isHelp(args[0]) {
		fmt.Fprintf(e.stdout, "usage: oncekit %s\n\nRun `%s <subcommand> -h` for its flags.\n", usage, fs.Name())
		return subcommand{}, nil, &exitError{code: 0}
	}
	sub, err := s.find(args[0])
	if err != nil {
		return subcommand{}, nil, err
	}
	// The flag set is the subcommand's: its errors name it.
	fs.Init(fs.Name()+" "+sub.name, flag.ContinueOnError)
	if sub.flags != nil {
		sub.flags(fs)
	}
	pos, err := parseInterspersed(fs, args[1:])
	return sub, pos, err
}

// find returns the subcommand called name, or formerly so, and otherwise a
// usage error naming the subcommands.
func (s *subcommands) find(name string) (subcommand, error) {
	if current, ok := s.aliases[name]; ok {
		name = current
	}
	for _, sub := range s.list {
		if sub.name == name {
			return sub, nil
		}
	}
	return subcommand{}, usagef("unknown subcommand %q: want %s", name, s.names())
}

// names lists the subcommands for an error: "list, parked or unpark".
func (s *subcommands) names() string {
	names := make([]string, len(s.list))
	for i, sub := range s.list {
		names[i] = sub.name
	}
	last := len(names) - 1
	return strings.Join(names[:last], ", ") + " or " + names[last]
}

// noArguments is the check of a subcommand that takes no positional
// arguments.
func noArguments(args []string) error {
	if len(args) > 0 {
		return usagef("unexpected arguments: %v", args)
	}
	return nil
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
