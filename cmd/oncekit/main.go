// Command oncekit is oncekit's command line: schema migrations, the outbox
// relay and side-effect dispatcher daemons, and the operator tools: status,
// drift, dead letters, side effects, the outbox. Run `oncekit help` for the
// list of commands and docs/operations.md for their use.
//
// Every command exits 2 on bad usage, and never prints a credential: help
// shows no value taken from the environment, and errors and logs hide the
// passwords of URLs and connection strings.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// env is what a command may touch of the outside world.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
}

// usageError is a mistake in the command line or configuration: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// exitError carries a specific exit code without printing anything more.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, &env{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}, os.Args[1:])
	stop()
	os.Exit(code)
}

func run(ctx context.Context, e *env, args []string) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		printHelp(e.stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "oncekit: unknown command %q\n\n", redact(args[0]))
		printHelp(e.stderr)
		return 2
	}
	err := c.run(ctx, e, args[1:])
	var ue *usageError
	var ee *exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ue):
		fmt.Fprintf(e.stderr, "oncekit %s: %s\n", c.name, redact(err.Error()))
		return 2
	default:
		fmt.Fprintf(e.stderr, "oncekit %s: %s\n", c.name, redact(err.Error()))
		return 1
	}
}
