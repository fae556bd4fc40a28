package fleet_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox/fleet"
)

// userHZ is the unit of /proc's CPU times on Linux (USER_HZ).
const userHZ = 100

// cpuTime is the CPU (user and system) that process pid has used.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command's name, which is in parentheses and
	// may hold spaces: state is the 3rd field, utime the 14th, stime the
	// 15th.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, err := strconv.ParseInt(f[11], 10, 64)
	if err != nil {
		return 0, err
	}
	st, err := strconv.ParseInt(f[12], 10, 64)
	if err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * time.Second / userHZ, nil
}

// localPorts are the local TCP ports of process pid's sockets.
func localPorts(pid int) ([]int32, error) {
	inodes := map[string]bool{}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, err
	}
	for _, fd := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	var ports []int32
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			return nil, err
		}
		s := bufio.NewScanner(f)
		for s.Scan() {
			fields := strings.Fields(s.Text())
			if len(fields) < 10 || !inodes[fields[9]] {
				continue
			}
			_, hexPort, _ := strings.Cut(fields[1], ":")
			if p, err := strconv.ParseInt(hexPort, 16, 32); err == nil {
				ports = append(ports, int32(p))
			}
		}
		_ = f.Close()
	}
	return ports, nil
}

// idleMember is a fleet member process serving a list of idle databases
// alone (k = 1) with the relay's defaults.
type idleMember struct {
	cmd *exec.Cmd
	dbs []*outboxDB
}

func startIdleMember(t *testing.T, w *world, id string, n int) *idleMember {
	t.Helper()
	m := &idleMember{}
	var defs []fleet.Database
	for i := range n {
		d := newOutboxDB(t, fmt.Sprintf("%s-db%d", id, i))
		m.dbs = append(m.dbs, d)
		defs = append(defs, d.def)
	}
	file := filepath.Join(t.TempDir(), "fleet.json")
	raw, err := json.Marshal(defs)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(file, raw, 0o600))
	m.cmd = exec.Command(testenv.OncekitBinary(t), "relay", "--fleet", file, "--id", id, "--nats-url", w.nats.URL,
		"--fleet-bucket", w.name+"-"+id, "--fleet-replicas", "1")
	out := &testenv.SyncBuffer{}
	m.cmd.Stdout, m.cmd.Stderr = out, out
	require.NoError(t, m.cmd.Start())
	exited := make(chan struct{})
	go func() { _ = m.cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = m.cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("member %s output:\n%s", id, out.String())
		}
	})
	return m
}

// cpu is the CPU used so far by the member's process and by the server
// backends of its connections.
func (m *idleMember) cpu(t *testing.T) (member, server time.Duration, conns int) {
	t.Helper()
	member, err := cpuTime(m.cmd.Process.Pid)
	require.NoError(t, err)
	ports, err := localPorts(m.cmd.Process.Pid)
	require.NoError(t, err)
	rows, err := m.dbs[0].db.Pool.Query(context.Background(),
		`SELECT pid FROM pg_stat_activity WHERE client_port = ANY($1) AND backend_type = 'client backend'`, ports)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var pid int
		require.NoError(t, rows.Scan(&pid))
		if c, err := cpuTime(pid); err == nil { // a backend may have just ended
			server += c
			conns++
		}
	}
	require.NoError(t, rows.Err())
	return member, server, conns
}

// The CPU an idle database costs: a member serving 1 idle database and one
// serving 10, each alone (k = 1) with the relay's defaults, measured over
// the same window, member process and server backends apart; a database's
// share is the difference over 9. Also the connections held.
func TestIdleDatabaseCPU(t *testing.T) {
	if testing.Short() {
		t.Skip("measures a 30s window")
	}
	testenv.RequireDirect(t, "finds the server backends of the member's own connections")
	t.Parallel()
	w := newWorld(t)
	one, ten := startIdleMember(t, w, "one", 1), startIdleMember(t, w, "ten", 10)
	for _, m := range []*idleMember{one, ten} {
		for _, d := range m.dbs {
			require.Eventually(t, func() bool {
				var n int
				require.NoError(t, d.db.Pool.QueryRow(context.Background(),
					`SELECT count(*) FROM relay_partitions WHERE expires_at > now()`).Scan(&n))
				return n == 16
			}, 60*time.Second, 100*time.Millisecond, "every partition owned")
		}
	}
	const window = 30 * time.Second
	m1, s1, _ := one.cpu(t)
	m10, s10, _ := ten.cpu(t)
	<-time.After(window) // the measurement window
	e1, f1, c1 := one.cpu(t)
	e10, f10, c10 := ten.cpu(t)
	pct := func(d time.Duration) float64 { return 100 * d.Seconds() / window.Seconds() }
	member1, server1, member10, server10 := pct(e1-m1), pct(f1-s1), pct(e10-m10), pct(f10-s10)
	perDB := func(a, b float64) float64 { return (b - a) / 9 }
	t.Logf("idle, relay defaults, %v window: 1 database: member %.2f%% of a core, server %.2f%% (%d connections); "+
		"10 databases: member %.2f%%, server %.2f%% (%d connections); a database's share: member %.3f%%, server %.3f%%",
		window, member1, server1, c1, member10, server10, c10, perDB(member1, member10), perDB(server1, server10))
	require.Positive(t, c1, "the member's connections were found")
	require.GreaterOrEqual(t, c10, 10, "a connection to each database at least")
	require.Positive(t, e10-m10, "the member used CPU")
	// Generous bounds that a member working per partition rather than per
	// database (16 statements per PollInterval each) would pass: a sanity
	// check, not the figure.
	require.Less(t, perDB(member1, member10)+perDB(server1, server10), 5.0, "an idle database costs under 5% of a core")
}
