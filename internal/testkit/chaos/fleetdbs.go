package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
	"github.com/oncekit/oncekit/internal/wait"
	"github.com/oncekit/oncekit/migrations"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/outbox/fleet"
)

// fleetSubject is the subject prefix of the fleet run's events: one subject
// per database under it, all in one stream.
const fleetSubject = "fleetchaos"

// fleetKeys is the number of ordering keys each writer spreads its events
// over.
const fleetKeys = 8

// fleetDB is one outbox database of the fleet run.
type fleetDB struct {
	name    string
	cluster *pgcluster.Cluster
	url     string
	pool    *pgxpool.Pool // the writer's and checker's, application_name fleetchaos
	ob      *outbox.Outbox
}

// newFleetDB creates database name on c, applies the migrations and the
// writer's table, and opens the run's pool to it.
func newFleetDB(ctx context.Context, c *pgcluster.Cluster, name string) (*fleetDB, error) {
	if err := c.CreateDB(ctx, name); err != nil {
		return nil, err
	}
	d := &fleetDB{name: name, cluster: c, url: c.URL(name)}
	cfg, err := pgxpool.ParseConfig(d.url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 3
	cfg.ConnConfig.RuntimeParams["application_name"] = "fleetchaos"
	cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	if d.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, err
	}
	if _, err := migrations.Up(ctx, d.pool); err != nil {
		d.pool.Close()
		return nil, fmt.Errorf("migrations of %s: %w", name, err)
	}
	// The writer records each event it commits here, in the same
	// transaction: the checker's truth of what was written.
	if _, err := d.pool.Exec(ctx, `CREATE TABLE fleetchaos_written (id uuid PRIMARY KEY, key text NOT NULL, seq bigint NOT NULL,
		at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		d.pool.Close()
		return nil, err
	}
	d.ob, err = outbox.New(nil)
	return d, err
}

func (d *fleetDB) def() fleet.Database { return fleet.Database{Name: d.name, URL: d.url} }

// write commits batch events every 1/(rate/batch) s until ctx ends, each
// under one of fleetKeys keys with the key's next sequence number, and
// records them in fleetchaos_written. Failures (the database down) are
// counted and the writer goes on.
func (d *fleetDB) write(ctx context.Context, rate float64, batch int) (commits, failures int) {
	seq := make([]int64, fleetKeys)
	n := 0
	wait.Every(ctx, time.Duration(float64(batch)/rate*float64(time.Second)), func(ctx context.Context) {
		msgs := make([]broker.Message, batch)
		keys := make([]string, batch)
		seqs := make([]int64, batch)
		ids := make([]uuid.UUID, batch)
		for i := range msgs {
			k := n % fleetKeys
			n++
			seq[k]++
			ids[i], keys[i], seqs[i] = uuid.New(), fmt.Sprintf("%s/k%d", d.name, k), seq[k]
			msgs[i] = broker.Message{ID: ids[i], Subject: fleetSubject + "." + d.name, Key: keys[i], Payload: fmt.Appendf(nil, `{"seq":%d}`, seq[k])}
		}
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		err := pgx.BeginFunc(wctx, d.pool, func(tx pgx.Tx) error {
			if _, err := d.ob.Enqueue(wctx, tx, msgs...); err != nil {
				return err
			}
			_, err := tx.Exec(wctx, `INSERT INTO fleetchaos_written (id, key, seq) SELECT * FROM unnest($1::uuid[], $2::text[], $3::bigint[])`, ids, keys, seqs)
			return err
		})
		if err != nil {
			failures++
			return
		}
		commits++
	})
	return commits, failures
}

// written reads what the writer committed.
func (d *fleetDB) written(ctx context.Context) ([]FleetWrite, error) {
	rows, err := d.pool.Query(ctx, `SELECT id::text, key, seq, at FROM fleetchaos_written`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (FleetWrite, error) {
		w := FleetWrite{DB: d.name}
		return w, r.Scan(&w.ID, &w.Key, &w.Seq, &w.At)
	})
}

// pending counts the events not yet published.
func (d *fleetDB) pending(ctx context.Context) (int64, error) {
	u, err := d.ob.Unpublished(ctx, d.pool)
	return u.Rows.Pending, err
}

// owners returns each partition's owner if its lease is unexpired ("" if
// none).
func (d *fleetDB) owners(ctx context.Context) (map[int]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	rows, err := d.pool.Query(ctx, `SELECT partition, CASE WHEN expires_at > now() THEN coalesce(owner, '') ELSE '' END FROM oncekit.relay_partitions`)
	if err != nil {
		return nil, err
	}
	out := map[int]string{}
	var p int
	var o string
	_, err = pgx.ForEachRow(rows, []any{&p, &o}, func() error { out[p] = o; return nil })
	return out, err
}

// relays counts the relays with a live heartbeat in d (relay_nodes): a
// member serving d that holds no partition is counted too.
func (d *fleetDB) relays(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var n int
	err := d.pool.QueryRow(ctx, `SELECT count(*) FROM oncekit.relay_nodes WHERE heartbeat_at > now() - make_interval(secs => $1)`,
		fleetLease.Seconds()).Scan(&n)
	return n, err
}

// connSampler keeps the most server connections with application_name app
// seen per database, sampling every cluster's pg_stat_activity: over the
// whole run, and while steady (no member joining or leaving).
type connSampler struct {
	app       string
	steady    atomic.Bool
	mu        sync.Mutex
	max       map[string]int
	steadyMax map[string]int
}

func (s *connSampler) run(ctx context.Context, pools []*pgxpool.Pool) {
	wait.Every(ctx, 250*time.Millisecond, func(ctx context.Context) {
		for _, p := range pools {
			qctx, cancel := context.WithTimeout(ctx, time.Second)
			rows, err := p.Query(qctx, `SELECT datname, count(*) FROM pg_stat_activity WHERE application_name = $1 GROUP BY datname`, s.app)
			if err == nil {
				var db string
				var n int
				_, _ = pgx.ForEachRow(rows, []any{&db, &n}, func() error {
					s.mu.Lock()
					s.max[db] = max(s.max[db], n)
					if s.steady.Load() {
						s.steadyMax[db] = max(s.steadyMax[db], n)
					}
					s.mu.Unlock()
					return nil
				})
			}
			cancel()
		}
	})
}

// snapshot returns the maxima: while steady, and over the whole run.
func (s *connSampler) snapshot() (steady, all map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.steadyMax), maps.Clone(s.max)
}

// fleetFile is the JSON of the fleet's database file.
func fleetFile(dbs []*fleetDB) ([]byte, error) {
	defs := make([]fleet.Database, len(dbs))
	for i, d := range dbs {
		defs[i] = d.def()
	}
	return json.MarshalIndent(defs, "", "  ")
}

// killedBy reports whether owner is a member of process prefix-pid.
func killedBy(owner, prefix string, pid int) bool {
	return strings.HasPrefix(owner, fmt.Sprintf("%s-%d-", prefix, pid))
}
