// Command chaos runs the payments example under faults and checks that every
// effect still happened once: `make chaos DURATION=2m [BROKEN=…] [POOLER=pgbouncer] [FAILOVER=sync|async] [PG=17]`.
//
// It exits 0 when the verdict is PASS, 1 when it is FAIL, 2 on bad flags and
// 3 when the run itself could not be carried out. Its last line is
// machine-readable:
//
//	chaos: ops=… ok=… failed=… unknown=… … lost=0 duplicate_effects=0 mismatched_keys=0 … pooler=none verdict=PASS
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/oncekit/oncekit/internal/testkit/chaos"
)

func main() {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	duration := fs.Duration("duration", 2*time.Minute, "how long load and faults last (the drain follows)")
	broken := fs.String("broken", "", "break a guarantee on purpose: "+strings.Join(chaos.BrokenBuilds, ", ")+"; with -failover sync: "+strings.Join(chaos.FailoverBrokenBuilds, ", "))
	dir := fs.String("dir", "", "directory for binaries, data and logs (default: a temp dir, removed after a PASS)")
	seed := fs.Uint64("seed", 0, "seed of the run's random choices (default: the clock)")
	rate := fs.Float64("rate", 0, "requests started per second (default: as fast as the clients go, up to 100,000 in all)")
	relay := fs.String("relay", "", "the relay: the polling one (default), or logical (events through the WAL)")
	pooler := fs.String("pooler", "", "a connection pooler between the daemons and PostgreSQL: none (default), or pgbouncer (transaction mode)")
	failover := fs.String("failover", "", "fail PostgreSQL over to a streaming standby instead of restarting it: sync or async replication")
	pg := fs.String("pg", "", "the PostgreSQL major version: the machine's (default), or 17 (make pg17; failover slots, for -relay logical -failover …)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if *broken != "" && !slices.Contains(chaos.BrokenBuilds, *broken) && !slices.Contains(chaos.FailoverBrokenBuilds, *broken) {
		fmt.Fprintf(os.Stderr, "chaos: --broken %q: want one of %s\n", *broken, strings.Join(chaos.BrokenBuilds, ", "))
		os.Exit(2)
	}
	if *relay != "" && *relay != "logical" {
		fmt.Fprintf(os.Stderr, "chaos: --relay %q: want logical, or nothing for the polling relay\n", *relay)
		os.Exit(2)
	}
	if *pooler != "" && !slices.Contains(chaos.Poolers, *pooler) {
		fmt.Fprintf(os.Stderr, "chaos: --pooler %q: want one of %s\n", *pooler, strings.Join(chaos.Poolers, ", "))
		os.Exit(2)
	}
	if *failover != "" && !slices.Contains(chaos.FailoverModes, *failover) {
		fmt.Fprintf(os.Stderr, "chaos: --failover %q: want one of %s\n", *failover, strings.Join(chaos.FailoverModes, ", "))
		os.Exit(2)
	}
	if *rate < 0 {
		fmt.Fprintln(os.Stderr, "chaos: --rate must not be negative")
		os.Exit(2)
	}
	if *duration < 10*time.Second {
		fmt.Fprintln(os.Stderr, "chaos: --duration must be at least 10s")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := chaos.Run(ctx, chaos.Options{Duration: *duration, Broken: *broken, Dir: *dir, Seed: *seed, Rate: *rate, Relay: *relay, Pooler: *pooler, Failover: *failover, PG: *pg, Log: os.Stderr})
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos: the run could not be carried out:", err)
		os.Exit(3)
	}
	fmt.Println(res.Line())
	if !res.Verdict.Pass() {
		os.Exit(1)
	}
}
