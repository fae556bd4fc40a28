package chaos

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/oncekit/oncekit/internal/crashpoint"
	"github.com/oncekit/oncekit/internal/testkit/leaktest"
)

// helperEnv makes the test binary act as a supervised process instead of
// running the tests (see runHelper).
const helperEnv = "CHAOS_TEST_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode == fleetMemberHelper {
		os.Exit(FleetMemberMain(os.Args[1:]))
	} else if mode != "" {
		os.Exit(runHelper(mode))
	}
	leaktest.Main(m)
}

// runHelper is a tiny supervised process:
//   - serve: runs until SIGTERM, then exits 0;
//   - deaf: ignores SIGTERM and runs until killed;
//   - crash: hits the crash point chaos.helper five times, then exits 7.
//
// It prints "helper <mode> up" once its signal handling is in place.
func runHelper(mode string) int {
	switch mode {
	case "serve":
		term := make(chan os.Signal, 1)
		signal.Notify(term, syscall.SIGTERM)
		fmt.Printf("helper %s up, pid %d\n", mode, os.Getpid())
		<-term
		fmt.Println("helper: SIGTERM, exiting")
		return 0
	case "deaf":
		signal.Ignore(syscall.SIGTERM)
		fmt.Printf("helper %s up, pid %d\n", mode, os.Getpid())
		select {}
	case "crash":
		for i := 1; i <= 5; i++ {
			fmt.Printf("helper: crash point hit %d\n", i)
			crashpoint.Hit("chaos.helper")
		}
		return 7
	}
	return 2
}
