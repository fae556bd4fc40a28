package oncekittest

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// DB is a PostgreSQL pool on a schema of the test's own, holding oncekit's
// tables.
type DB struct {
	// Pool's connections have search_path set to Schema, so the test's own
	// tables land there too. It is closed when the test ends.
	Pool *pgxpool.Pool
	// Schema is the schema's name: pass it as the Schema of every oncekit
	// Config in the test. It is dropped when the test ends.
	Schema string
	// URL is the database URL with search_path set to Schema, for a
	// process or pool of the test's own.
	URL string
}

// NewDB creates a fresh schema, applies every oncekit migration in it, and
// returns a pool on it. DATABASE_URL names the server (default
// postgres://postgres@127.0.0.1:5432/postgres). Tests using it may run in
// parallel.
func NewDB(tb testing.TB) *DB {
	tb.Helper()
	db := testenv.NewDB(tb)
	return &DB{Pool: db.Pool, Schema: db.Schema, URL: db.URL}
}

// Name returns a short name unique to this call, safe as a schema, stream,
// durable or subject token: the test's name, lower-cased, plus random hex.
func Name(tb testing.TB) string {
	return testenv.Name(tb)
}
