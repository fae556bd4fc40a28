package pgcluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// Standby makes a streaming standby of p with pg_basebackup (-R: it
// follows p as a hot standby, read-only, in recovery) on a port of its own,
// starts it and waits until it accepts connections. Its log is p's.
func (p *Cluster) Standby(ctx context.Context) (*Cluster, error) {
	return p.StandbyVia(ctx, p.Addr())
}

// StandbyVia is Standby with the standby reaching p at addr (host:port),
// such as a proxy in front of p: its base backup and its WAL stream both
// go through addr, which a test can then cut.
func (p *Cluster) StandbyVia(ctx context.Context, addr string) (*Cluster, error) {
	host, pport, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: standby's primary address: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	s, err := p.newStandby()
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Cluster, error) { _ = os.RemoveAll(s.base); return nil, err }
	if err := s.run(ctx, "pg_basebackup", "-D", s.data, "-R", "-X", "stream", "--no-sync", "--checkpoint=fast",
		"-h", host, "-p", pport, "-U", "postgres"); err != nil {
		return fail(err)
	}
	// The copied postgresql.conf names p's port and socket: later lines win.
	conf := fmt.Sprintf("\n# standby\nport = %d\nunix_socket_directories = '%s'\nhot_standby = on\n", s.port, s.data)
	f, err := os.OpenFile(filepath.Join(s.data, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fail(err)
	}
	if _, err := f.WriteString(conf); err != nil {
		f.Close()
		return fail(err)
	}
	if err := f.Close(); err != nil {
		return fail(err)
	}
	if err := s.firstStart(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// newStandby makes the directory and picks the port of a new standby of
// p, with p's server programs and log; nothing runs yet.
func (p *Cluster) newStandby() (*Cluster, error) {
	port, err := pickPort()
	if err != nil {
		return nil, err
	}
	base, err := os.MkdirTemp("", "oncekit-pg-standby-")
	if err != nil {
		return nil, err
	}
	s := &Cluster{bin: p.bin, base: base, data: filepath.Join(base, "data"), logPath: p.logPath, port: port}
	if err := os.Chmod(base, 0o755); err != nil {
		_ = os.RemoveAll(base)
		return nil, err
	}
	if os.Geteuid() == 0 {
		if err := chownToPostgres(base); err != nil {
			_ = os.RemoveAll(base)
			return nil, err
		}
	}
	return s, nil
}
