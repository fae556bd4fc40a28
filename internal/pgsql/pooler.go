package pgsql

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// ErrPooled is wrapped by the errors of what needs a session of its own
// (the replication stream, a session lock, LISTEN) when it finds a
// connection pooler between it and PostgreSQL.
var ErrPooled = errors.New("oncekit: the connection goes through a connection pooler")

// Direct reports whether conn talks to a PostgreSQL backend of its own: the
// process ID the server announced at start-up (BackendKeyData) is the one
// the backend reports. A pooler (PgBouncer, Supavisor, pgcat, Odyssey)
// announces a key of its own, since the server connection behind it changes;
// a TCP proxy passes the server's through, and is direct.
func Direct(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var pid uint32
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return false, fmt.Errorf("check for a connection pooler: %w", err)
	}
	return pid == conn.PgConn().PID(), nil
}

// RefusedStartupParameter reports whether err is a server, or a pooler in
// front of it, refusing a connection's start-up parameter: PgBouncer's
// "unsupported startup parameter" (SQLSTATE 08P01), which it answers for
// every parameter it does not track (replication, options, search_path, jit).
func RefusedStartupParameter(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "08P01" && strings.Contains(strings.ToLower(pgErr.Message), "startup parameter")
}

// UUIDs returns ids as an argument for a uuid[] parameter that pgx encodes
// in every query execution mode: a slice of [16]byte or uuid.UUID has no
// registered array type, so under default_query_exec_mode=exec (no
// server-side description, the mode for a pooler without prepared
// statements) pgx cannot encode it; []pgtype.UUID it encodes in binary.
func UUIDs[T ~[16]byte](ids []T) []pgtype.UUID {
	out := make([]pgtype.UUID, len(ids))
	for i, id := range ids {
		out[i] = pgtype.UUID{Bytes: id, Valid: true}
	}
	return out
}

// JSON returns encoded JSON as an argument for a json or jsonb parameter
// that pgx sends as text in every query execution mode (nil: NULL). A
// []byte would go as bytea under default_query_exec_mode=exec, which
// describes nothing, and PostgreSQL would read its hex form as JSON.
func JSON(b []byte) any {
	if b == nil {
		return nil
	}
	return string(b)
}

// UUID is id as an argument for a uuid parameter that pgx encodes in binary
// in every query execution mode (a [16]byte has no registered type, and a
// uuid.UUID goes through driver.Valuer and text).
func UUID[T ~[16]byte](id T) pgtype.UUID { return pgtype.UUID{Bytes: id, Valid: true} }
