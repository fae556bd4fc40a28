// Command chaosfleet runs a relay fleet under faults and checks that every
// event still reached JetStream once and in order: `make chaos-fleet
// DURATION=2m`.
//
// It exits 0 when the verdict is PASS, 1 when it is FAIL, 2 on bad flags and
// 3 when the run itself could not be carried out. Its last line is
// machine-readable:
//
//	chaos-fleet: databases=11 members=30 events=… lost=0 duplicates=0 order_violations=0 … verdict=PASS
//
// Run as `chaosfleet member …` it is one process of the fleet: several
// fleet members (chaos.FleetMemberMain), which the run starts and kills.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/oncekit/oncekit/internal/testkit/chaos"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "member" {
		os.Exit(chaos.FleetMemberMain(os.Args[2:]))
	}
	fs := flag.NewFlagSet("chaosfleet", flag.ContinueOnError)
	duration := fs.Duration("duration", 2*time.Minute, "how long writes and faults last (the drain follows); at least 30s")
	dir := fs.String("dir", "", "directory for data and logs (default: a temp dir, removed after a PASS)")
	seed := fs.Uint64("seed", 0, "seed of the run's random choices (default: the clock)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if *duration < 30*time.Second {
		fmt.Fprintln(os.Stderr, "chaos-fleet: --duration must be at least 30s")
		os.Exit(2)
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos-fleet:", err)
		os.Exit(3)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	v, err := chaos.RunFleet(ctx, chaos.FleetOptions{Duration: *duration, Dir: *dir, Seed: *seed, Log: os.Stderr,
		Member: func(args []string) (string, []string, []string) {
			return self, append([]string{"member"}, args...), nil
		}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos-fleet: the run could not be carried out:", err)
		os.Exit(3)
	}
	fmt.Println(v.Line())
	if !v.Pass() {
		os.Exit(1)
	}
}
