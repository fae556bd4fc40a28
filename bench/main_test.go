package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
)

// scaleServerEnv names an environment variable that, set to "throwaway",
// runs the benchmarks on a PostgreSQL cluster of their own, started with
// scaleServerSettings and removed afterwards (make bench-scale sets it
// unless DATABASE_URL is given).
const scaleServerEnv = "ONCEKIT_SCALE_SERVER"

// keepLogEnv names an environment variable that, set, keeps the throwaway
// cluster's log (it logs every autovacuum run and checkpoint) after a run
// that passed; a failed run always keeps it.
const keepLogEnv = "ONCEKIT_SCALE_KEEP_LOG"

// scaleServerSettings configure the throwaway cluster as docs/operations.md
// advises for a large history: checkpoints spaced by time rather than forced
// by WAL volume, shared_buffers that hold the claims' key at 10M rows, in
// huge pages where the machine has them reserved (vm.nr_hugepages: see
// hugePagesSetting), and autovacuum on as in production.
const scaleServerSettings = `
fsync = on
synchronous_commit = on
full_page_writes = on
shared_buffers = 2GB
max_wal_size = 16GB
checkpoint_timeout = 15min
autovacuum = on
max_connections = 200
log_autovacuum_min_duration = 0
log_checkpoints = on
`

func TestMain(m *testing.M) {
	code := runBenchmarks(m)
	stopE2ECluster()
	os.Exit(code)
}

// runBenchmarks runs m, on a throwaway cluster when scaleServerEnv asks
// for one.
func runBenchmarks(m *testing.M) int {
	if os.Getenv(scaleServerEnv) != "throwaway" {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "oncekit-scale-log-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	pg, err := pgcluster.Start(context.Background(), pgcluster.Options{LogDir: dir, Settings: scaleServerSettings + "huge_pages = " + hugePagesSetting() + "\n"})
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: a throwaway PostgreSQL cluster: %v\n", err)
		return 1
	}
	if err := os.Setenv("DATABASE_URL", pg.URL("postgres")); err != nil {
		pg.Close()
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	// The server stops before its log directory goes: pg_ctl writes to the
	// log, and a stop that cannot would leave the server running, its
	// shared memory (huge pages) held.
	pg.Close()
	if code == 0 && os.Getenv(keepLogEnv) == "" {
		_ = os.RemoveAll(dir)
	} else {
		fmt.Fprintf(os.Stderr, "bench: the throwaway cluster's log is %s\n", pg.LogPath())
	}
	return code
}

// hugePagesInUse says how many of the machine's huge pages are taken, as
// /proc/meminfo counts them (PostgreSQL 15 does not say whether it has them).
func hugePagesInUse() string {
	n, ok := hugePages()
	if !ok {
		return "huge pages in use unknown"
	}
	return fmt.Sprintf("%d of %d huge pages in use", n["HugePages_Total"]-n["HugePages_Free"]+n["HugePages_Rsvd"], n["HugePages_Total"])
}

// hugePagesSetting is the throwaway cluster's huge_pages: on where the
// machine reserves huge pages, so that a server that cannot have them fails
// to start instead of running without them (as huge_pages = try once did,
// unnoticed until its figures came in), and off elsewhere.
func hugePagesSetting() string {
	if n, ok := hugePages(); ok && n["HugePages_Total"] > 0 {
		return "on"
	}
	return "off"
}

// hugePages reads the HugePages_ counts of /proc/meminfo.
func hugePages() (map[string]int, bool) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return nil, false
	}
	n := map[string]int{}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.HasPrefix(k, "HugePages_") {
			n[k], _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return n, true
}
