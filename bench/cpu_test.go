package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// processCPU is the CPU time (user+system) this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// backendCPU is the CPU time used by the PostgreSQL backends serving
// connections named app, read from /proc; ok is false when PostgreSQL is not
// local (or /proc is not readable), and the figure is then not reported.
func backendCPU(ctx context.Context, pool *pgxpool.Pool, app string) (cpu time.Duration, ok bool) {
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
	if err != nil {
		return 0, false
	}
	defer rows.Close()
	var ticks int64
	for rows.Next() {
		var pid int
		if rows.Scan(&pid) != nil {
			return 0, false
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, false
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if len(f) < 13 {
			return 0, false
		}
		u, _ := strconv.ParseInt(f[11], 10, 64) // utime
		k, _ := strconv.ParseInt(f[12], 10, 64) // stime
		ticks += u + k
	}
	return time.Duration(ticks) * 10 * time.Millisecond, rows.Err() == nil // USER_HZ = 100
}

// idleTicks reads the machine's idle (and I/O wait) ticks and its total
// ticks from /proc/stat: over a pass, their ratio shows whether the pass
// kept both cores busy, which a rate on a shared machine depends on.
func idleTicks() (idle, total int64) {
	b, _ := os.ReadFile("/proc/stat")
	f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0])[1:]
	for i, v := range f {
		n, _ := strconv.ParseInt(v, 10, 64)
		total += n
		if i == 3 || i == 4 {
			idle += n
		}
	}
	return
}
