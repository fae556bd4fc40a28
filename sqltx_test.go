package oncekit_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/sideeffect"
)

// sqlWorld is a test's schema seen through database/sql (pgx's stdlib over
// the test's pool) with an orders table.
type sqlWorld struct {
	t  *testing.T
	db *testenv.DB
	sq *sql.DB
}

func newSQLWorld(t *testing.T) *sqlWorld {
	t.Helper()
	db := testenv.NewDB(t)
	sq := stdlib.OpenDBFromPool(db.Pool)
	t.Cleanup(func() { _ = sq.Close() })
	_, err := sq.Exec(`CREATE TABLE orders (id uuid PRIMARY KEY, amount int NOT NULL, meta jsonb, at timestamptz NOT NULL DEFAULT now())`)
	require.NoError(t, err)
	return &sqlWorld{t: t, db: db, sq: sq}
}

func (w *sqlWorld) count(query string, args ...any) int {
	w.t.Helper()
	var n int
	require.NoError(w.t, w.db.Pool.QueryRow(context.Background(), query, args...).Scan(&n))
	return n
}

// An order row written through database/sql and its outbox event written
// through FromSQLTx commit together and roll back together.
func TestFromSQLTxEnqueue(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		t.Run(map[bool]string{true: "commit", false: "rollback"}[commit], func(t *testing.T) {
			t.Parallel()
			w := newSQLWorld(t)
			ctx := context.Background()
			ob, err := outbox.New(&outbox.Config{Schema: w.db.Schema})
			require.NoError(t, err)
			id := uuid.New()
			stx, err := w.sq.BeginTx(ctx, nil)
			require.NoError(t, err)
			_, err = stx.ExecContext(ctx, `INSERT INTO orders (id, amount) VALUES ($1, 100)`, id)
			require.NoError(t, err)
			tx, err := oncekit.FromSQLTx(ctx, stx)
			require.NoError(t, err)
			requireSameBackend(t, stx, tx)
			res, err := ob.Enqueue(ctx, tx, broker.Message{ID: id, Subject: "orders.created", Payload: []byte(`{}`)})
			require.NoError(t, err)
			require.Empty(t, res.Duplicates)
			// Seen inside the transaction, by database/sql, before the end.
			var n int
			require.NoError(t, stx.QueryRowContext(ctx, `SELECT count(*) FROM outbox WHERE id = $1`, id).Scan(&n))
			require.Equal(t, 1, n)
			require.ErrorIs(t, tx.Commit(ctx), oncekit.ErrTxOwned)
			if commit {
				require.NoError(t, stx.Commit())
			} else {
				require.NoError(t, stx.Rollback())
			}
			want := map[bool]int{true: 1, false: 0}[commit]
			require.Equal(t, want, w.count(`SELECT count(*) FROM orders WHERE id = $1`, id))
			require.Equal(t, want, w.count(`SELECT count(*) FROM outbox WHERE id = $1`, id))
			// After the end, the pgx.Tx refuses rather than run outside it.
			_, err = ob.Enqueue(ctx, tx, broker.Message{ID: uuid.New(), Subject: "orders.created"})
			require.ErrorIs(t, err, sql.ErrTxDone)
		})
	}
}

// The ledger's Record in a *sql.Tx: the effect commits and rolls back with
// the business row; a savepoint (Begin) works too.
func TestFromSQLTxRecord(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		t.Run(map[bool]string{true: "commit", false: "rollback"}[commit], func(t *testing.T) {
			t.Parallel()
			w := newSQLWorld(t)
			ctx := context.Background()
			led, err := sideeffect.New(&sideeffect.Config{Schema: w.db.Schema})
			require.NoError(t, err)
			id := uuid.New()
			stx, err := w.sq.BeginTx(ctx, nil)
			require.NoError(t, err)
			_, err = stx.ExecContext(ctx, `INSERT INTO orders (id, amount) VALUES ($1, 7)`, id)
			require.NoError(t, err)
			tx, err := oncekit.FromSQLTx(ctx, stx)
			require.NoError(t, err)
			rec, err := led.Record(ctx, tx, sideeffect.Effect{SourceID: id.String(), Kind: "email.receipt"})
			require.NoError(t, err)
			require.False(t, rec.Existing)
			again, err := led.Record(ctx, tx, sideeffect.Effect{SourceID: id.String(), Kind: "email.receipt"})
			require.NoError(t, err)
			require.Equal(t, rec.ID, again.ID)
			sp, err := tx.Begin(ctx)
			require.NoError(t, err)
			_, err = sp.Exec(ctx, `INSERT INTO orders (id, amount) VALUES ($1, 8)`, uuid.New())
			require.NoError(t, err)
			require.NoError(t, sp.Rollback(ctx))
			if commit {
				require.NoError(t, stx.Commit())
			} else {
				require.NoError(t, stx.Rollback())
			}
			want := map[bool]int{true: 1, false: 0}[commit]
			require.Equal(t, want, w.count(`SELECT count(*) FROM orders`))
			require.Equal(t, want, w.count(`SELECT count(*) FROM side_effects WHERE source_id = $1`, id.String()))
		})
	}
}

// fakeDriver is a database/sql driver that is not pgx's: enough to begin a
// transaction and refuse an argument it does not know.
type fakeDriver struct{}

func (fakeDriver) Open(string) (driver.Conn, error) { return fakeConn{}, nil }

type fakeConn struct{}

func (fakeConn) Prepare(string) (driver.Stmt, error) { return fakeStmt{}, nil }
func (fakeConn) Close() error                        { return nil }
func (fakeConn) Begin() (driver.Tx, error)           { return fakeTx{}, nil }

type fakeStmt struct{}

func (fakeStmt) Close() error                               { return nil }
func (fakeStmt) NumInput() int                              { return -1 }
func (fakeStmt) Exec([]driver.Value) (driver.Result, error) { return driver.RowsAffected(0), nil }
func (fakeStmt) Query([]driver.Value) (driver.Rows, error)  { return nil, errors.New("fake: no rows") }

// lenientDriver is fakeDriver taking any argument, as pgx's does: it runs
// the statement without ever handing the argument to pgx.
type lenientDriver struct{}

func (lenientDriver) Open(string) (driver.Conn, error) { return lenientConn{}, nil }

type lenientConn struct{ fakeConn }

func (lenientConn) CheckNamedValue(*driver.NamedValue) error { return nil }

type fakeTx struct{}

func (fakeTx) Commit() error   { return nil }
func (fakeTx) Rollback() error { return nil }

var registerFake sync.Once

// Bad input at the call: a typed error, never a panic.
func TestFromSQLTxBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("nil", func(t *testing.T) {
		_, err := oncekit.FromSQLTx(ctx, nil)
		require.ErrorIs(t, err, oncekit.ErrNilTx)
		require.ErrorIs(t, oncekit.WithSQLTx(ctx, nil, func(*sql.Tx) error { return nil }), oncekit.ErrNilTx)
	})
	registerFake.Do(func() {
		sql.Register("oncekit-fake", fakeDriver{})
		sql.Register("oncekit-fake-lenient", lenientDriver{})
	})
	for _, name := range []string{"oncekit-fake", "oncekit-fake-lenient"} {
		t.Run("not-pgx/"+name, func(t *testing.T) {
			sq, err := sql.Open(name, "")
			require.NoError(t, err)
			defer sq.Close()
			stx, err := sq.BeginTx(ctx, nil)
			require.NoError(t, err)
			defer stx.Rollback()
			_, err = oncekit.FromSQLTx(ctx, stx)
			require.ErrorIs(t, err, oncekit.ErrNotPgx)
			t.Log(err)
		})
	}
	w := newSQLWorld(t)
	for _, end := range []string{"committed", "rolled-back"} {
		t.Run(end, func(t *testing.T) {
			stx, err := w.sq.BeginTx(ctx, nil)
			require.NoError(t, err)
			if end == "committed" {
				require.NoError(t, stx.Commit())
			} else {
				require.NoError(t, stx.Rollback())
			}
			_, err = oncekit.FromSQLTx(ctx, stx)
			require.ErrorIs(t, err, sql.ErrTxDone)
			t.Log(err)
		})
	}
	t.Run("commit-statement", func(t *testing.T) {
		stx, err := w.sq.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer stx.Rollback()
		_, err = stx.ExecContext(ctx, `COMMIT`)
		require.NoError(t, err)
		_, err = oncekit.FromSQLTx(ctx, stx)
		require.ErrorIs(t, err, oncekit.ErrNotInTransaction)
		t.Log(err)
	})
}

// WithSQLTx gives database/sql code the transaction oncekit owns; here an
// inbox handler's. A handler that succeeds commits its row with the claim;
// one that fails leaves no row (its message is dead-lettered).
func TestWithSQLTxInboxHandler(t *testing.T) {
	t.Parallel()
	w := newSQLWorld(t)
	n := testenv.NewNATS(t)
	ctx := context.Background()
	stream := testenv.Name(t)
	_, err := natsjs.EnsureStream(ctx, n.JS, natsjs.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}})
	require.NoError(t, err)
	src, err := natsjs.NewSource(ctx, n.JS, &natsjs.SourceConfig{Stream: stream, Durable: "orders"})
	require.NoError(t, err)
	t.Cleanup(src.Close)
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		return oncekit.WithSQLTx(ctx, tx, func(stx *sql.Tx) error {
			if _, err := stx.ExecContext(ctx, `INSERT INTO orders (id, amount, meta) VALUES ($1, $2, $3)`,
				msg.ID, len(msg.Payload), `{"via":"sql"}`); err != nil {
				return err
			}
			var amount int64
			var meta []byte
			var id string
			var at time.Time
			if err := stx.QueryRowContext(ctx, `SELECT id, amount, meta, at FROM orders WHERE id = $1`, msg.ID).
				Scan(&id, &amount, &meta, &at); err != nil {
				return err
			}
			if id != msg.ID.String() || amount != int64(len(msg.Payload)) || !strings.Contains(string(meta), "sql") {
				return inbox.Permanent(errors.New("read back a different row"))
			}
			if string(msg.Payload) == "refuse" {
				return inbox.Permanent(errors.New("refused"))
			}
			return nil
		})
	})
	c, err := inbox.NewConsumer(w.db.Pool, src, h, &inbox.Config{
		Name: "orders", Schema: w.db.Schema, Registerer: prometheus.NewRegistry(),
	})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	pub, err := natsjs.NewPublisher(n.Conn, nil)
	require.NoError(t, err)
	ok, refused := uuid.New(), uuid.New()
	for _, r := range pub.Publish(ctx, []broker.Message{
		{ID: ok, Subject: stream + ".orders", Payload: []byte("accept")},
		{ID: refused, Subject: stream + ".orders", Payload: []byte("refuse")},
	}) {
		require.NoError(t, r.Err)
	}
	require.Eventually(t, func() bool { s := c.Stats(); return s.Processed == 1 && s.DeadLettered == 1 },
		30*time.Second, 10*time.Millisecond)
	require.Equal(t, 1, w.count(`SELECT count(*) FROM orders WHERE id = $1`, ok))
	require.Equal(t, 0, w.count(`SELECT count(*) FROM orders WHERE id = $1`, refused))
}

// A handler's *sql.Tx cannot end the transaction its owner holds.
func TestWithSQLTxOwned(t *testing.T) {
	t.Parallel()
	w := newSQLWorld(t)
	ctx := context.Background()
	tx, err := w.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	err = oncekit.WithSQLTx(ctx, tx, func(stx *sql.Tx) error {
		requireSameBackend(t, stx, tx)
		_, err := stx.ExecContext(ctx, `INSERT INTO orders (id, amount) VALUES ($1, 1)`, uuid.New())
		require.NoError(t, err)
		require.ErrorIs(t, stx.Commit(), oncekit.ErrTxOwned)
		return nil
	})
	require.ErrorIs(t, err, oncekit.ErrTxOwned)
	// A *sql.Tx kept past WithSQLTx is ended: it refuses.
	var kept *sql.Tx
	require.NoError(t, oncekit.WithSQLTx(ctx, tx, func(stx *sql.Tx) error { kept = stx; return nil }))
	_, err = kept.ExecContext(ctx, `INSERT INTO orders (id, amount) VALUES ($1, 1)`, uuid.New())
	require.ErrorIs(t, err, sql.ErrTxDone)
}

// The rest of pgx.Tx through FromSQLTx: a batch, COPY, a prepared
// statement, rows read to the end, a nested savepoint released.
func TestFromSQLTxPgxCalls(t *testing.T) {
	t.Parallel()
	w := newSQLWorld(t)
	ctx := context.Background()
	stx, err := w.sq.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer stx.Rollback()
	tx, err := oncekit.FromSQLTx(ctx, stx)
	require.NoError(t, err)
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO orders (id, amount) VALUES ($1, 1)`, uuid.New())
	b.Queue(`INSERT INTO orders (id, amount) VALUES ($1, 2)`, uuid.New())
	require.NoError(t, tx.SendBatch(ctx, b).Close())
	n, err := tx.CopyFrom(ctx, pgx.Identifier{"orders"}, []string{"id", "amount"},
		pgx.CopyFromRows([][]any{{uuid.New(), 3}, {uuid.New(), 4}}))
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	_, err = tx.Prepare(ctx, "sum_orders", `SELECT sum(amount) FROM orders`)
	require.NoError(t, err)
	var sum int64
	require.NoError(t, tx.QueryRow(ctx, "sum_orders").Scan(&sum))
	require.EqualValues(t, 10, sum)
	sp, err := tx.Begin(ctx)
	require.NoError(t, err)
	inner, err := sp.Begin(ctx)
	require.NoError(t, err)
	_, err = inner.Exec(ctx, `INSERT INTO orders (id, amount) VALUES ($1, 5)`, uuid.New())
	require.NoError(t, err)
	require.NoError(t, inner.Commit(ctx))
	require.NoError(t, sp.Commit(ctx))
	require.ErrorIs(t, sp.Commit(ctx), pgx.ErrTxClosed)
	rows, err := tx.Query(ctx, `SELECT amount FROM orders ORDER BY amount`)
	require.NoError(t, err)
	amounts, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2, 3, 4, 5}, amounts)
	// database/sql sees the same transaction.
	require.NoError(t, stx.QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&n))
	require.EqualValues(t, 5, n)
	require.NoError(t, stx.Commit())
	require.Equal(t, 5, w.count(`SELECT count(*) FROM orders`))
}

// The HTTP edge's SameTx mode: the handler writes through database/sql in
// the claim's transaction; a 201 commits the row with the stored response,
// a 500 leaves neither.
func TestWithSQLTxEdgeSameTx(t *testing.T) {
	t.Parallel()
	w := newSQLWorld(t)
	edge, err := idempotency.New(w.db.Pool, &idempotency.Config{Schema: w.db.Schema, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	mw, err := edge.Route(&idempotency.Route{Operation: "create-order", Mode: idempotency.SameTx, SharedScope: true})
	require.NoError(t, err)
	srv := httptest.NewServer(mw(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		tx, ok := idempotency.Tx(r)
		require.True(t, ok)
		info, _ := idempotency.FromRequest(r)
		err := oncekit.WithSQLTx(r.Context(), tx, func(stx *sql.Tx) error {
			_, err := stx.ExecContext(r.Context(), `INSERT INTO orders (id, amount) VALUES ($1, 5)`, info.ID())
			return err
		})
		if err != nil || r.Header.Get("X-Fail") != "" {
			http.Error(rw, "failed", http.StatusInternalServerError)
			return
		}
		rw.WriteHeader(http.StatusCreated)
	})))
	t.Cleanup(srv.Close)
	post := func(key string, fail bool) int {
		req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", `"`+key+`"`)
		req.Header.Set("Content-Type", "application/json")
		if fail {
			req.Header.Set("X-Fail", "1")
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusInternalServerError, post("k-fail", true))
	require.Equal(t, 0, w.count(`SELECT count(*) FROM orders`))
	require.Equal(t, http.StatusCreated, post("k-ok", false))
	require.Equal(t, 1, w.count(`SELECT count(*) FROM orders`))
	require.Equal(t, http.StatusCreated, post("k-ok", false)) // replayed
	require.Equal(t, 1, w.count(`SELECT count(*) FROM orders`))
}

// requireSameBackend checks that stx and tx run on one server process and
// in one transaction: no second connection.
func requireSameBackend(t *testing.T, stx *sql.Tx, tx pgx.Tx) {
	t.Helper()
	ctx := context.Background()
	const q = `SELECT pg_backend_pid(), txid_current()`
	var pid1, pid2, xid1, xid2 int64
	require.NoError(t, stx.QueryRowContext(ctx, q).Scan(&pid1, &xid1))
	require.NoError(t, tx.QueryRow(ctx, q).Scan(&pid2, &xid2))
	require.Equal(t, pid1, pid2)
	require.Equal(t, xid1, xid2)
}

// One order and its event per transaction: pgx's own transaction, a
// *sql.Tx through FromSQLTx, and a pgx transaction written through
// WithSQLTx.
func BenchmarkSQLTx(b *testing.B) {
	db := testenv.NewDB(b)
	sq := stdlib.OpenDBFromPool(db.Pool)
	b.Cleanup(func() { _ = sq.Close() })
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE orders (id uuid PRIMARY KEY, amount int NOT NULL)`)
	require.NoError(b, err)
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
	require.NoError(b, err)
	const insert = `INSERT INTO orders (id, amount) VALUES ($1, 1)`
	enqueue := func(tx pgx.Tx, id uuid.UUID) error {
		_, err := ob.Enqueue(ctx, tx, broker.Message{ID: id, Subject: "orders.created", Payload: []byte(`{}`)})
		return err
	}
	b.Run("pgx", func(b *testing.B) {
		for b.Loop() {
			id := uuid.New()
			require.NoError(b, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, insert, id); err != nil {
					return err
				}
				return enqueue(tx, id)
			}))
		}
	})
	b.Run("FromSQLTx", func(b *testing.B) {
		for b.Loop() {
			id := uuid.New()
			stx, err := sq.BeginTx(ctx, nil)
			require.NoError(b, err)
			_, err = stx.ExecContext(ctx, insert, id)
			require.NoError(b, err)
			tx, err := oncekit.FromSQLTx(ctx, stx)
			require.NoError(b, err)
			require.NoError(b, enqueue(tx, id))
			require.NoError(b, stx.Commit())
		}
	})
	b.Run("WithSQLTx", func(b *testing.B) {
		for b.Loop() {
			id := uuid.New()
			require.NoError(b, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				if err := oncekit.WithSQLTx(ctx, tx, func(stx *sql.Tx) error {
					_, err := stx.ExecContext(ctx, insert, id)
					return err
				}); err != nil {
					return err
				}
				return enqueue(tx, id)
			}))
		}
	})
}
