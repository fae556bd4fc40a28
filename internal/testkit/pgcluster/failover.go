package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/wait"
)

// Kill SIGKILLs the server's postmaster and every process it started, all
// at once, as when the machine under it loses power: no backend finishes
// what it was doing, nothing more reaches the WAL or a standby. The data
// directory is left as it was; a killed primary is not started again in a
// failover (it comes back as a new standby, from a base backup of the new
// primary), though Start would run crash recovery on it.
func (p *Cluster) Kill() error {
	pm, err := p.postmasterPID()
	if err != nil {
		return err
	}
	procs := append(children(pm), pm)
	for _, pid := range procs {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return wait.Until(ctx, 20*time.Millisecond, func(context.Context) error {
		for _, pid := range procs {
			if syscall.Kill(pid, 0) == nil && !zombie(pid) {
				return fmt.Errorf("pgcluster: process %d still alive after SIGKILL", pid)
			}
		}
		return nil
	})
}

// postmasterPID reads the first line of postmaster.pid.
func (p *Cluster) postmasterPID() (int, error) {
	b, err := os.ReadFile(filepath.Join(p.data, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("pgcluster: the server is not running: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pgcluster: postmaster.pid: %q is not a process ID", line)
	}
	return pid, nil
}

// children lists the processes whose parent is pid, from /proc.
func children(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, _ := parentOf(child); ppid == pid {
			out = append(out, child)
		}
	}
	return out
}

// parentOf reads a process's parent and state from /proc/PID/stat.
func parentOf(pid int) (ppid int, state byte) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0
	}
	// pid (comm) state ppid …: comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, 0
	}
	ppid, _ = strconv.Atoi(f[1])
	return ppid, f[0][0]
}

func zombie(pid int) bool {
	_, state := parentOf(pid)
	return state == 'Z' || state == 0
}

// Promote ends a standby's recovery (`pg_ctl promote -w`): from then on it
// is a primary on a new timeline and accepts writes.
func (p *Cluster) Promote(ctx context.Context) error {
	return p.run(ctx, "pg_ctl", "-D", p.data, "-w", "-t", "60", "promote")
}

// Replica is a standby as its primary sees it in pg_stat_replication.
type Replica struct {
	State, SyncState string
	// Behind is how much WAL the primary has written that the standby has
	// not yet flushed, in bytes.
	Behind int64
	// FlushLag is the primary's measure of the time between its writing
	// WAL and the standby's confirming its flush (zero when unknown).
	FlushLag time.Duration
}

// ErrNoReplica is returned by Replica when no standby streams from the
// server.
var ErrNoReplica = errors.New("pgcluster: no standby streams from this server")

// Replica reads the first standby streaming from p (a walsender of a
// physical standby).
func (p *Cluster) Replica(ctx context.Context) (Replica, error) {
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return Replica{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var r Replica
	var lagMicros *int64
	err = conn.QueryRow(ctx, `SELECT state, sync_state,
			coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn), 0)::bigint,
			(extract(epoch FROM flush_lag) * 1e6)::bigint
		FROM pg_stat_replication
		WHERE application_name <> 'pg_basebackup'
		ORDER BY state = 'streaming' DESC LIMIT 1`).Scan(&r.State, &r.SyncState, &r.Behind, &lagMicros)
	if errors.Is(err, pgx.ErrNoRows) {
		return Replica{}, ErrNoReplica
	}
	if lagMicros != nil {
		r.FlushLag = time.Duration(*lagMicros) * time.Microsecond
	}
	return r, err
}

// ReceivedLSN returns, on a standby, the last WAL position it received and
// flushed (pg_last_wal_receive_lsn), and the last it replayed.
func (p *Cluster) ReceivedLSN(ctx context.Context) (received, replayed string, err error) {
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return "", "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	err = conn.QueryRow(ctx, `SELECT coalesce(pg_last_wal_receive_lsn()::text, ''), coalesce(pg_last_wal_replay_lsn()::text, '')`).Scan(&received, &replayed)
	return received, replayed, err
}

// CurrentLSN returns the primary's current WAL write position.
func (p *Cluster) CurrentLSN(ctx context.Context) (string, error) {
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var lsn string
	err = conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn)
	return lsn, err
}
