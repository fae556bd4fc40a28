package chaos

import (
	"cmp"
	"context"
	"fmt"

	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
)

// pgSettings are the run's server settings: fsync and full-page writes on,
// since crash safety is what a run tests; small shared_buffers and WAL so
// that checkpoints come often; connections for every process of the run.
const pgSettings = `
fsync = on
synchronous_commit = on
full_page_writes = on
shared_buffers = 16MB
max_connections = 200
max_wal_size = 256MB
wal_level = logical
`

// StartPG starts the run's throwaway PostgreSQL cluster, its log in dir.
func StartPG(ctx context.Context, dir string) (*pgcluster.Cluster, error) {
	return pgcluster.Start(ctx, pgcluster.Options{LogDir: dir, Settings: pgSettings})
}

// postgres is the run's PostgreSQL: one server, or (with failovers) a
// Topology of a primary and its standby.
type postgres struct {
	single *pgcluster.Cluster
	*Topology
}

// startPostgres starts the run's server and, for a failover mode, its
// standby.
func startPostgres(ctx context.Context, opt Options, logf func(string, ...any)) (*postgres, error) {
	settings := pgSettings
	if opt.Failover == "sync" {
		settings += syncSettings
	}
	pgOpt := pgcluster.Options{LogDir: opt.Dir, Settings: settings}
	var pg *pgcluster.Cluster
	var err error
	if opt.PG == "17" {
		bin, err := pgcluster.PG17Bin()
		if err != nil {
			return nil, fmt.Errorf("%w (make pg17 installs it)", err)
		}
		pg, err = pgcluster.StartIn(ctx, bin, pgOpt)
	} else {
		pg, err = pgcluster.Start(ctx, pgOpt)
	}
	if err != nil || opt.Failover == "" {
		return &postgres{single: pg}, err
	}
	// With the logical relay, the standby keeps a copy of its slot
	// (PostgreSQL 17's failover slots).
	var slots SlotSync
	if opt.Relay == "logical" {
		slots = SlotSync{Standby: "oncekit_standby"}
	}
	t, err := NewTopology(ctx, pg, opt.Failover == "sync", slots)
	if err != nil {
		pg.Close()
		return nil, err
	}
	logf("postgres %s primary %s with a streaming standby (%s replication%s)", cmp.Or(opt.PG, "default"), pg.Addr(), opt.Failover,
		map[bool]string{true: ", failover slots", false: ""}[slots.Standby != ""])
	return &postgres{Topology: t}, nil
}

func (p *postgres) replicated() bool { return p.Topology != nil }

// Primary returns the server that takes writes now.
func (p *postgres) Primary() *pgcluster.Cluster {
	if p.Topology != nil {
		return p.Topology.Primary()
	}
	return p.single
}

// Follow makes proxy follow the primary across failovers.
func (p *postgres) Follow(proxy *PGProxy) {
	if p.Topology != nil {
		p.Topology.Follow(proxy)
	}
}

// Keep keeps the primary's data directory.
func (p *postgres) Keep() string { return p.Primary().Keep() }

// Close stops every server.
func (p *postgres) Close() {
	if p.Topology != nil {
		p.Topology.Close()
		return
	}
	p.single.Close()
}
