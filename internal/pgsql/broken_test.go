package pgsql_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

func TestBrokenClassifies(t *testing.T) {
	t.Parallel()
	pg := func(code string) error {
		return fmt.Errorf("inbox: claim: %w", &pgconn.PgError{Severity: "ERROR", Code: code})
	}
	for _, tc := range []struct {
		name  string
		err   error
		class string
	}{
		{"syntax error", pg("42601"), "42"},
		{"undefined table", pg("42P01"), "42"},
		{"undefined column", pg("42703"), "42"},
		{"insufficient privilege", pg("42501"), "42"},
		{"feature not supported", pg("0A000"), "0A"},
		{"read-only transaction", pg("25006"), "25"},
		{"invalid schema name", pg("3F000"), "3F"},
		{"invalid catalog name", pg("3D000"), "3D"},
		{"prepared statement unknown", pg("26000"), "26"},
		{"invalid password", pg("28P01"), "28"},
		{"encode", errors.New("inbox: begin and claim: failed to encode args[1]: unable to encode [][16]uint8{0x1} into text format for unknown type (OID 0): cannot find encode plan"), "client"},
		{"argument count", errors.New("expected 1 arguments, got 2"), "client"},
		{"scan", fmt.Errorf("x: %w", pgx.ScanArgError{ColumnIndex: 0, Err: errors.New("cannot scan")}), "client"},

		{"nil", nil, ""},
		{"connection exception", pg("08006"), ""},
		{"too many connections", pg("53300"), ""},
		{"disk full", pg("53100"), ""},
		{"admin shutdown", pg("57P01"), ""},
		{"query canceled", pg("57014"), ""},
		{"serialization failure", pg("40001"), ""},
		{"deadlock", pg("40P01"), ""},
		{"lock timeout", pg("55P03"), ""},
		{"in failed transaction", pg("25P02"), ""},
		{"data exception", pg("22P02"), ""},
		{"unique violation", pg("23505"), ""},
		{"internal error", pg("XX000"), ""},
		{"context", context.DeadlineExceeded, ""},
		{"canceled", context.Canceled, ""},
		{"eof", io.ErrUnexpectedEOF, ""},
		{"net", &net.OpError{Op: "dial", Err: errors.New("connection refused")}, ""},
		{"closed", pgconn.ErrConnClosed, ""},
		{"no rows", pgx.ErrNoRows, ""},
		{"other", errors.New("conn busy"), ""},
	} {
		require.Equal(t, tc.class, pgsql.BrokenClass(tc.err), tc.name)
		require.Equal(t, tc.class != "", pgsql.Broken(tc.err), tc.name)
	}
}

// The errors a real PostgreSQL and pgx give for statements that cannot
// succeed are broken; those of a statement that can are not.
func TestBrokenOnRealErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE broken_t (id int PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, err)

	role := "r_" + strings.TrimPrefix(db.Schema, "t_")
	_, err = db.Pool.Exec(ctx, fmt.Sprintf(`CREATE ROLE %q NOLOGIN`, role))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), fmt.Sprintf(`DROP ROLE %q`, role)) })
	_, err = db.Pool.Exec(ctx, fmt.Sprintf(`GRANT USAGE ON SCHEMA %q TO %q`, db.Schema, role))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %q`, role)) })

	inTx := func(f func(tx pgx.Tx) error) error {
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		return f(tx)
	}
	exec := func(sql string, args ...any) func(pgx.Tx) error {
		return func(tx pgx.Tx) error { _, err := tx.Exec(ctx, sql, args...); return err }
	}
	broken := map[string]func(pgx.Tx) error{
		"42601": exec(`SELEC 1`),
		"42P01": exec(`SELECT * FROM no_such_table`),
		"42703": exec(`SELECT no_such_column FROM broken_t`),
		"42501": func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL ROLE %q`, role)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `SELECT * FROM broken_t`)
			return err
		},
		"25006": func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET TRANSACTION READ ONLY`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO broken_t VALUES (1, 'x')`)
			return err
		},
		"0A000": exec(`SELECT count(*) FROM broken_t FOR UPDATE`),
		"3F000": exec(`CREATE TABLE no_such_schema.t (id int)`),
		// The inbox's claim under default_query_exec_mode=exec before it
		// encoded its own arguments.
		"client": exec(`SELECT $1::uuid[]`, pgx.QueryExecModeExec, [][16]byte{uuid.New()}),
	}
	for code, f := range broken {
		err := inTx(f)
		require.Error(t, err, code)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			require.Equal(t, code, pgErr.Code, pgErr.Message)
		} else {
			require.Equal(t, "client", code, "%v", err)
		}
		require.True(t, pgsql.Broken(err), "%s: %v", code, err)
		t.Logf("%s: %v", code, err)
	}

	// What can succeed the next time is not broken.
	notBroken := map[string]func(pgx.Tx) error{
		"23505": func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO broken_t VALUES (1, 'x'), (1, 'y')`)
			return err
		},
		"22P02": exec(`SELECT 'x'::int`),
		"23502": exec(`INSERT INTO broken_t VALUES (2, NULL)`),
		"57014": func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL statement_timeout = '10ms'`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `SELECT pg_sleep(5)`)
			return err
		},
	}
	for code, f := range notBroken {
		err := inTx(f)
		require.Error(t, err, code)
		require.False(t, pgsql.Broken(err), "%s: %v", code, err)
	}
	// A backend terminated under its session. Through a pooler the pool's
	// own statement may run on that very server connection.
	if testenv.Pooled(t, db.URL) {
		return
	}
	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer func() { _ = conn.Close(ctx) }()
	var pid int
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	_, err = db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `SELECT 1`)
	require.Error(t, err)
	require.False(t, pgsql.Broken(err), "%v", err)
}

// A Watch logs a cause at error level once per interval however many
// failures it sees, counts each one, and reports it until the statement
// succeeds again.
func TestWatchLogsOnceCountsAndHeals(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	counted := map[string]int{}
	w := pgsql.NewWatch(log, func(statement, class string) { counted[statement+"/"+class]++ })

	require.NoError(t, w.Err())
	require.False(t, w.Failed("claim", context.DeadlineExceeded), "a timeout is not the watch's")
	require.NoError(t, w.Err())

	denied := fmt.Errorf("inbox: begin and claim: %w", &pgconn.PgError{Severity: "ERROR", Code: "42501", Message: "permission denied for table processed_messages"})
	for range 1000 {
		require.True(t, w.Failed("claim", denied))
	}
	require.Equal(t, 1000, counted["claim/42"])
	require.Equal(t, 1, strings.Count(buf.String(), "level=ERROR"), buf.String())
	require.Contains(t, buf.String(), "statement=claim class=42 failures=1")
	require.Contains(t, buf.String(), "permission denied for table processed_messages")

	err := w.Err()
	require.ErrorIs(t, err, pgsql.ErrStatementBroken)
	require.Contains(t, err.Error(), "claim failing since")
	require.Contains(t, err.Error(), "(1000 failures)")
	require.Contains(t, err.Error(), "permission denied for table processed_messages")

	// Another cause is logged at once.
	enc := errors.New("failed to encode args[1]: unable to encode [][16]uint8{0x1}")
	require.True(t, w.Failed("claim", enc))
	require.Equal(t, 2, strings.Count(buf.String(), "level=ERROR"))

	w.OK("batch") // another statement's success heals nothing
	require.Error(t, w.Err())
	w.OK("claim")
	require.NoError(t, w.Err())
	require.Contains(t, buf.String(), "statement succeeds again")
}
