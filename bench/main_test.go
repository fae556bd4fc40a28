package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/oncekit/oncekit/internal/pgcluster"
)

// scaleServerEnv names an environment variable that, set to "throwaway",
// runs the benchmarks on a PostgreSQL cluster of their own, started with
// scaleServerSettings and removed afterwards (make bench-scale sets it
// unless DATABASE_URL is given).
const scaleServerEnv = "ONCEKIT_SCALE_SERVER"

// scaleServerSettings configure the throwaway cluster as docs/operations.md
// advises for a large history: checkpoints spaced by time rather than forced
// by WAL volume, shared_buffers that hold the claims' key at 10M rows, in
// huge pages where the machine has them reserved (vm.nr_hugepages), and
// autovacuum on as in production.
const scaleServerSettings = `
fsync = on
synchronous_commit = on
full_page_writes = on
shared_buffers = 2GB
huge_pages = try
max_wal_size = 16GB
checkpoint_timeout = 15min
autovacuum = on
max_connections = 200
`

func TestMain(m *testing.M) {
	os.Exit(runBenchmarks(m))
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
	pg, err := pgcluster.Start(context.Background(), pgcluster.Options{LogDir: dir, Settings: scaleServerSettings})
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: a throwaway PostgreSQL cluster: %v\n", err)
		return 1
	}
	defer pg.Close()
	if err := os.Setenv("DATABASE_URL", pg.URL("postgres")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	if code == 0 {
		_ = os.RemoveAll(dir)
	} else {
		fmt.Fprintf(os.Stderr, "bench: the throwaway cluster's log is %s\n", pg.LogPath())
	}
	return code
}

// hugePagesInUse says how many of the machine's huge pages are taken, as
// /proc/meminfo counts them: with huge_pages = try a server that could not
// have them runs without, and PostgreSQL 15 does not say which.
func hugePagesInUse() string {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "huge pages in use unknown"
	}
	n := map[string]int{}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.HasPrefix(k, "HugePages_") {
			n[k], _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return fmt.Sprintf("%d of %d huge pages in use", n["HugePages_Total"]-n["HugePages_Free"]+n["HugePages_Rsvd"], n["HugePages_Total"])
}
