package outbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit/internal/pgsql"
)

// ErrPooled is wrapped by a *PooledError: a connection that needs a
// PostgreSQL session of its own goes through a connection pooler.
var ErrPooled = errors.New("oncekit: the connection goes through a connection pooler")

// The connections of a LogicalRelay that need a session of their own, as
// PooledError.Conn names them.
const (
	// PooledLease is the lease's connection, which holds a session
	// advisory lock.
	PooledLease = "lease"
	// PooledReplication is the replication stream's connection.
	PooledReplication = "replication"
)

// PooledError reports that the connection string a LogicalRelay was given
// reaches PostgreSQL through a connection pooler (PgBouncer, Supavisor,
// pgcat, Odyssey), where its lease (a session advisory lock, which a
// transaction pooler would leave on a server connection the next client
// inherits) and its replication stream cannot be. Run returns it at once
// rather than retry: the pool given to NewLogicalRelay may go through the
// pooler, LogicalRelayConfig.ReplicationURL must then reach the server
// directly.
type PooledError struct {
	// Conn is the connection that found the pooler: PooledLease or
	// PooledReplication.
	Conn string
	// Err is the pooler's refusal (PgBouncer: "unsupported startup
	// parameter: replication"), or nil when the pooler accepted the
	// connection and the server's process ID behind it was not the one the
	// connection announced.
	Err error
}

// Error implements error.
func (e *PooledError) Error() string {
	what := "its lease (a session advisory lock) would outlive the transaction on a server connection the next client inherits"
	if e.Conn == PooledReplication {
		what = "the replication stream needs a server connection of its own"
	}
	found := "the server process behind it is not the one it announced"
	var pgErr *pgconn.PgError
	switch {
	case errors.As(e.Err, &pgErr): // the pooler's words, without the address
		found = fmt.Sprintf("%s: %s (SQLSTATE %s)", pgErr.Severity, pgErr.Message, pgErr.Code)
	case e.Err != nil:
		found = e.Err.Error()
	}
	return fmt.Sprintf("%v: the logical relay's %s connection found one (%s), and %s. "+
		"Give the relay a connection string to the server itself, not to the pooler "+
		"(LogicalRelayConfig.ReplicationURL; oncekit relay --replication-url or ONCEKIT_REPLICATION_URL); "+
		"its pool (oncekit: --database-url) may stay on the pooler",
		ErrPooled, e.Conn, found, what)
}

// Unwrap returns ErrPooled, and the pooler's refusal when there is one.
func (e *PooledError) Unwrap() []error {
	errs := []error{ErrPooled, pgsql.ErrPooled} // the library's own, for its packages
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// parseDirect parses a connection string given for the connections that
// need a session of their own, without pgxpool's parameters (pool_*), which
// a URL shared by a pool and a connection carries and PostgreSQL would
// refuse.
func parseDirect(connString string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	for k := range cfg.RuntimeParams {
		if strings.HasPrefix(k, "pool_") {
			delete(cfg.RuntimeParams, k)
		}
	}
	return cfg, nil
}

// connConfig returns a copy of the settings of the connections that need a
// session of their own: LogicalRelayConfig.ReplicationURL's, else those of
// the pool's connections.
func (r *LogicalRelay) connConfig(ctx context.Context) (*pgx.ConnConfig, error) {
	if r.repl != nil {
		return r.repl.Copy(), nil
	}
	c, err := r.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the pool's connection settings: %w", err)
	}
	defer c.Release()
	return c.Conn().Config(), nil // a copy
}

// connectLease opens the lease's connection: a connection of its own, not
// the pool's, which reaches a backend of its own (else a *PooledError).
func (r *LogicalRelay) connectLease(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := r.connConfig(ctx)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = "oncekit-logical-relay-lease"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		if pgsql.RefusedStartupParameter(err) {
			return nil, &PooledError{Conn: PooledLease, Err: err}
		}
		return nil, fmt.Errorf("lease connection: %w", err)
	}
	direct, err := pgsql.Direct(ctx, conn)
	if err == nil && !direct {
		err = &PooledError{Conn: PooledLease}
	}
	if err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return conn, nil
}

// connectReplication opens a replication connection (replication=database)
// and checks it reaches a backend of its own: a pooler refuses the
// start-up parameter (PgBouncer), or passes a process ID of its own.
func (r *LogicalRelay) connectReplication(ctx context.Context) (*pgconn.PgConn, error) {
	cfg, err := r.connConfig(ctx)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = "oncekit-logical-relay"
	conn, err := pgconn.ConnectConfig(ctx, &cfg.Config)
	if err != nil {
		if pgsql.RefusedStartupParameter(err) {
			return nil, &PooledError{Conn: PooledReplication, Err: err}
		}
		return nil, fmt.Errorf("replication connection: %w", err)
	}
	// A logical replication connection runs SQL in the simple protocol.
	pid, err := backendPID(ctx, conn)
	if err == nil && pid != conn.PID() {
		err = &PooledError{Conn: PooledReplication}
	}
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return conn, nil
}

// ErrDatabaseMismatch is wrapped by a *DatabaseMismatchError.
var ErrDatabaseMismatch = errors.New("outbox: the logical relay's replication connection reaches another database than its pool")

// DatabaseMismatchError reports that LogicalRelayConfig.ReplicationURL
// reaches another database than the LogicalRelay's pool: another cluster
// (system identifier) or another database of the cluster. Run returns it at
// once rather than retry.
type DatabaseMismatchError struct {
	// PoolSystemID and PoolDatabase are the pool's cluster and database.
	PoolSystemID, PoolDatabase string
	// ReplicationSystemID and ReplicationDatabase are the replication
	// connection's.
	ReplicationSystemID, ReplicationDatabase string
}

// Error implements error.
func (e *DatabaseMismatchError) Error() string {
	return fmt.Sprintf("%v: the pool reaches database %q of cluster %s, the replication connection (LogicalRelayConfig.ReplicationURL; "+
		"oncekit relay --replication-url or ONCEKIT_REPLICATION_URL) database %q of cluster %s",
		ErrDatabaseMismatch, e.PoolDatabase, e.PoolSystemID, e.ReplicationDatabase, e.ReplicationSystemID)
}

// Unwrap returns ErrDatabaseMismatch.
func (e *DatabaseMismatchError) Unwrap() error { return ErrDatabaseMismatch }

// poolDatabaseSQL reads the cluster and database the pool reaches, as
// IDENTIFY_SYSTEM names them on the replication connection.
const poolDatabaseSQL = `SELECT system_identifier::text, current_database() FROM pg_control_system()`

// sameDatabase checks that the pool reaches the database id (the
// replication connection's).
func (r *LogicalRelay) sameDatabase(ctx context.Context, id serverIdentity) error {
	var sys, db string
	if err := r.pool.QueryRow(ctx, poolDatabaseSQL).Scan(&sys, &db); err != nil {
		return fmt.Errorf("outbox: identify the pool's database: %w", err)
	}
	if sys != id.systemID || db != id.database {
		return &DatabaseMismatchError{PoolSystemID: sys, PoolDatabase: db, ReplicationSystemID: id.systemID, ReplicationDatabase: id.database}
	}
	return nil
}

// backendPID is pg_backend_pid() read over conn in the simple protocol.
func backendPID(ctx context.Context, conn *pgconn.PgConn) (uint32, error) {
	res, err := conn.Exec(ctx, "SELECT pg_backend_pid()").ReadAll()
	if err != nil {
		return 0, fmt.Errorf("check for a connection pooler: %w", err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 1 {
		return 0, errors.New("check for a connection pooler: pg_backend_pid() returned no row")
	}
	pid, err := strconv.ParseUint(string(res[0].Rows[0][0]), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("check for a connection pooler: %w", err)
	}
	return uint32(pid), nil
}
