package main

import (
	"os"
	"strings"
	"testing"

	"github.com/oncekit/oncekit/examples/sqs/fauxqs"
)

// argsEnv, when set, makes the test binary run the command instead of the
// tests, with these arguments (separated by \x1f): the SIGKILL tests start
// the relay and the consumer that way, as separate processes.
const argsEnv = "ONCEKIT_SQS_EXAMPLE_ARGS"

func TestMain(m *testing.M) {
	if args := os.Getenv(argsEnv); args != "" {
		os.Args = append(os.Args[:1], strings.Split(args, "\x1f")...)
		main()
		os.Exit(0)
	}
	code := m.Run()
	fauxqs.StopShared()
	os.Exit(code)
}
