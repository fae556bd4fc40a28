package pgcluster

import (
	"context"
	"errors"
	"testing"
)

// StartForTest starts a cluster for test t with opt (LogDir defaults to a
// directory of t's), closed when t ends. It skips t only when the
// PostgreSQL server binaries are not installed, and fails it on any other
// error.
func StartForTest(ctx context.Context, t testing.TB, opt Options) *Cluster {
	t.Helper()
	if opt.LogDir == "" {
		opt.LogDir = t.TempDir()
	}
	pg, err := Start(ctx, opt)
	if errors.Is(err, ErrNoPostgres) {
		t.Skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Close)
	return pg
}

// StartPG17ForTest is StartForTest on PostgreSQL 17 (PG17Bin). It skips t
// when PostgreSQL 17 is not installed (`make pg17` installs it).
func StartPG17ForTest(ctx context.Context, t testing.TB, opt Options) *Cluster {
	t.Helper()
	bin, err := PG17Bin()
	if errors.Is(err, ErrNoPG17) {
		t.Skip("PostgreSQL 17 is not installed: run `make pg17` (or set " + PG17BinEnv + ")")
	}
	if opt.LogDir == "" {
		opt.LogDir = t.TempDir()
	}
	pg, err := StartIn(ctx, bin, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Close)
	return pg
}
