package chaos

import (
	"context"

	"github.com/oncekit/oncekit/internal/pgcluster"
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
