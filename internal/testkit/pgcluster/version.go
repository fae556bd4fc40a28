package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/jackc/pgx/v5"
)

// PG17BinEnv names an environment variable that, when set, is the
// directory holding PostgreSQL 17's initdb and pg_ctl. Otherwise PG17Bin
// looks in PG17Dir (where `make pg17` installs them), then in
// /usr/lib/postgresql/17/bin.
const PG17BinEnv = "ONCEKIT_PG17_BIN"

// PG17Dir is where scripts/install-pg17.sh (`make pg17`) installs
// PostgreSQL 17; its programs are in bin/.
const PG17Dir = "/usr/local/lib/oncekit-pg17"

// ErrNoPG17 is returned by PG17Bin when no PostgreSQL 17 server is
// installed.
var ErrNoPG17 = errors.New("pgcluster: PostgreSQL 17 server binaries not found (run `make pg17`)")

// PG17Bin returns the directory holding PostgreSQL 17's initdb and
// pg_ctl, for StartIn, or ErrNoPG17.
func PG17Bin() (string, error) {
	dirs := []string{filepath.Join(PG17Dir, "bin"), "/usr/lib/postgresql/17/bin"}
	if d := os.Getenv(PG17BinEnv); d != "" {
		dirs = []string{d}
	}
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", ErrNoPG17
}

// StartIn is Start with the server programs of directory bin (such as
// PG17Bin's) rather than the machine's default.
func StartIn(ctx context.Context, bin string, opt Options) (*Cluster, error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if _, err := os.Stat(filepath.Join(bin, "initdb")); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoPostgres, err)
	}
	port, err := pickPort()
	if err != nil {
		return nil, err
	}
	base, err := os.MkdirTemp("", "oncekit-pg-")
	if err != nil {
		return nil, err
	}
	p := &Cluster{bin: bin, base: base, data: filepath.Join(base, "data"), logPath: filepath.Join(opt.LogDir, "postgres.log"), port: port}
	if err := p.create(ctx, opt.Settings); err != nil {
		_ = os.RemoveAll(base)
		return nil, err
	}
	if err := p.firstStart(ctx); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Major returns the server's major version (15, 17).
func (p *Cluster) Major(ctx context.Context) (int, error) {
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var v int
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&v); err != nil {
		return 0, err
	}
	return v / 10000, nil
}
