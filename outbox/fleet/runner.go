package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit/internal/backoff"
	"github.com/oncekit/oncekit/internal/redact"
	"github.com/oncekit/oncekit/internal/wait"
	"github.com/oncekit/oncekit/outbox"
)

// runner serves one database on this member: it starts the database's
// relay, and when that fails waits its own backoff (the database's
// breaker) and tries again, until stopped. Nothing it does waits on another
// database.
type runner struct {
	f      *Fleet
	db     Database
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}
}

// startRunner starts serving db once prev (the runner of an earlier
// assignment of the same name, or nil) has stopped.
func (f *Fleet) startRunner(ctx context.Context, db Database, prev *runner) *runner {
	ctx, cancel := context.WithCancel(ctx)
	r := &runner{f: f, db: db, log: f.log.With("database", db.Name), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		if prev != nil {
			select {
			case <-prev.done:
			case <-ctx.Done():
				return
			}
		}
		r.run(ctx)
	}()
	return r
}

// stop asks r to stop; r.done closes once its relay released its leases.
func (r *runner) stop() { r.cancel() }

func (r *runner) run(ctx context.Context) {
	policy := backoff.Policy{Min: r.f.cfg.MinBackoff, Max: r.f.cfg.MaxBackoff, Jitter: 0.2}
	bo := policy.Start()
	m := r.f.m
	for {
		began := time.Now()
		err := r.serve(ctx)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errResize) {
			continue
		}
		if time.Since(began) > r.f.cfg.MaxBackoff {
			bo.Reset() // it ran a while: a new run of failures
		}
		m.up.WithLabelValues(r.db.Name).Set(0)
		m.failures.WithLabelValues(r.db.Name).Inc()
		d := bo.Next()
		r.log.Warn("database backed off", "err", redact.String(err.Error()), "retry_in", d)
		if !wait.Sleep(ctx, d) {
			return
		}
	}
}

// serve runs the database's relay until ctx ends (nil) or it cannot run.
func (r *runner) serve(ctx context.Context) error {
	cfg := r.f.cfg
	ob, err := outbox.New(&outbox.Config{Schema: r.db.Schema})
	if err != nil {
		return err
	}
	parts, err := r.partitions(ctx, ob)
	if err != nil {
		return err
	}
	budget := r.budget(parts)
	pool, err := r.pool(ctx, budget)
	if err != nil {
		return err
	}
	defer pool.Close()
	rc := cfg.Relay
	rc.ID = cfg.ID
	rc.Logger = r.log
	rc.PollOnly = true
	rc.Registerer = nil
	scope := newScoped(cfg.Registerer, r.db.Name)
	if scope != nil {
		rc.Registerer = scope
		defer scope.release()
	}
	relay, err := outbox.NewRelay(pool, ob, r.f.pub, &rc)
	if err != nil {
		return err
	}
	r.f.m.budget.WithLabelValues(r.db.Name).Set(float64(budget))
	r.f.m.up.WithLabelValues(r.db.Name).Set(1)
	r.log.Info("serving database", "partitions", parts, "connections", budget)
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	go r.check(ctx, pool, relay, budget, stop)
	if err := relay.Run(ctx); err != nil {
		return err
	}
	if err := context.Cause(ctx); !errors.Is(err, context.Canceled) {
		return err // the check stopped it
	}
	return nil
}

// budget is the connections this member opens to a database of parts
// partitions: those that serve it share its partitions, k of the members,
// or all of them when fewer.
func (r *runner) budget(parts int) int {
	cfg := r.f.cfg
	return Budget(parts, min(cfg.Replicas, max(len(r.f.Members()), 1)), cfg.MaxConnsPerDatabase)
}

// errDown ends a relay whose database the check could not reach.
var errDown = errors.New("fleet: database unreachable")

// errResize ends a relay whose budget no longer fits its database: the
// partition count changed (a repartition) or the fleet fell below k
// members. The runner starts it again at once with a pool of the new size.
var errResize = errors.New("fleet: connection budget changed")

// check pings the database every MemberTTL/3 while its relay runs: a
// database that stops answering is counted and reported down, and after
// three failed checks in a row its relay is stopped (leases given back for
// the others, if they reach it) and the database backed off. A budget that
// no longer fits (see errResize) stops the relay too, to be started again
// with a pool of the new size: a pool's size is fixed when it opens.
func (r *runner) check(ctx context.Context, pool *pgxpool.Pool, relay *outbox.Relay, budget int, stop context.CancelCauseFunc) {
	failed := 0
	wait.Every(ctx, r.f.cfg.MemberTTL/3, func(ctx context.Context) {
		if n := relay.Partitions(); n > 0 {
			if want := r.budget(n); want != budget {
				r.log.Info("connection budget changed; restarting the database's relay", "partitions", n, "connections", budget, "want", want)
				stop(errResize)
				return
			}
		}
		pctx, cancel := context.WithTimeout(ctx, r.f.cfg.ConnectTimeout)
		defer cancel()
		err := pool.Ping(pctx)
		switch {
		case ctx.Err() != nil:
		case err == nil:
			failed = 0
			r.f.m.up.WithLabelValues(r.db.Name).Set(1)
		default:
			failed++
			r.f.m.up.WithLabelValues(r.db.Name).Set(0)
			r.f.m.failures.WithLabelValues(r.db.Name).Inc()
			if failed >= 3 {
				stop(fmt.Errorf("%w: %s", errDown, redact.String(err.Error())))
			}
		}
	})
}

// connConfig parses the database's URL with the fleet's connection
// settings.
func (r *runner) connConfig() (*pgxpool.Config, error) {
	pc, err := pgxpool.ParseConfig(r.db.URL)
	if err != nil {
		// pgx's parse errors can quote the string: say only that it failed.
		return nil, fmt.Errorf("%w: database %q: url does not parse", ErrInvalidConfig, r.db.Name)
	}
	pc.ConnConfig.ConnectTimeout = r.f.cfg.ConnectTimeout
	pc.ConnConfig.RuntimeParams["application_name"] = r.f.cfg.ApplicationName
	return pc, nil
}

// partitions reads ob's partition count on a connection of its own,
// closed before the pool opens (the budget depends on it).
func (r *runner) partitions(ctx context.Context, ob *outbox.Outbox) (int, error) {
	pc, err := r.connConfig()
	if err != nil {
		return 0, err
	}
	conn, err := pgx.ConnectConfig(ctx, pc.ConnConfig)
	if err != nil {
		return 0, fmt.Errorf("fleet: connect: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	return ob.PartitionCount(ctx, conn)
}

// pool opens the database's pool with at most budget connections.
func (r *runner) pool(ctx context.Context, budget int) (*pgxpool.Pool, error) {
	pc, err := r.connConfig()
	if err != nil {
		return nil, err
	}
	pc.MaxConns = int32(budget)
	pc.MinConns = 0
	return pgxpool.NewWithConfig(ctx, pc)
}

var _ prometheus.Registerer = (*scoped)(nil)
