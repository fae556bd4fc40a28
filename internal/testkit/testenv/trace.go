package testenv

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// Statement is one statement a traced pool ran to completion.
type Statement struct {
	SQL   string
	Args  []any
	Tag   pgconn.CommandTag
	Batch int // the batch (one round trip) it was sent in, counted from 1; 0: sent alone
}

// StatementLog records the statements (Exec, Query, QueryRow, and each of a
// batch's) run on the pools it traces, for tests that must see how work was
// split into statements and round trips: a bounded DELETE, say, rather than
// only its total.
type StatementLog struct {
	mu      sync.Mutex
	stmts   []Statement
	batches int
}

type (
	startKey struct{}
	batchKey struct{}
)

// TraceBatchStart implements pgx.BatchTracer: it numbers the batch.
func (l *StatementLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	l.mu.Lock()
	l.batches++
	n := l.batches
	l.mu.Unlock()
	return context.WithValue(ctx, batchKey{}, n)
}

// TraceBatchQuery implements pgx.BatchTracer; failed statements are not
// recorded.
func (l *StatementLog) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	if data.Err != nil {
		return
	}
	n, _ := ctx.Value(batchKey{}).(int)
	l.mu.Lock()
	l.stmts = append(l.stmts, Statement{SQL: data.SQL, Args: data.Args, Tag: data.CommandTag, Batch: n})
	l.mu.Unlock()
}

// TraceBatchEnd implements pgx.BatchTracer.
func (l *StatementLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TraceQueryStart implements pgx.QueryTracer.
func (l *StatementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, startKey{}, data)
}

// TraceQueryEnd implements pgx.QueryTracer; failed statements are not
// recorded.
func (l *StatementLog) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if data.Err != nil {
		return
	}
	start, _ := ctx.Value(startKey{}).(pgx.TraceQueryStartData)
	l.mu.Lock()
	l.stmts = append(l.stmts, Statement{SQL: start.SQL, Args: start.Args, Tag: data.CommandTag})
	l.mu.Unlock()
}

// Matching returns the recorded statements whose SQL contains substr, in
// the order they completed.
func (l *StatementLog) Matching(substr string) []Statement {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Statement
	for _, s := range l.stmts {
		if strings.Contains(s.SQL, substr) {
			out = append(out, s)
		}
	}
	return out
}

// TracedPool opens a pool on db's schema whose statements log records. It
// is closed when the test ends.
func (db *DB) TracedPool(t testing.TB, log *StatementLog) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = log
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}
