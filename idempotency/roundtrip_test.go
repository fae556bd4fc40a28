package idempotency_test

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// tripConn counts round trips on a PostgreSQL connection: each run of writes
// that follows the server's answer starts a new round trip. The answer is
// noted when a read returns bytes, not when it starts: pgconn may start
// reading before it writes (its flush reads in the background so that
// neither side blocks), and a read begun before a write would hide the next
// round trip.
type tripConn struct {
	net.Conn
	trips     *atomic.Int64
	lastWrite atomic.Bool
}

func (c *tripConn) Write(p []byte) (int, error) {
	if !c.lastWrite.Swap(true) {
		c.trips.Add(1)
	}
	return c.Conn.Write(p)
}

func (c *tripConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.lastWrite.Store(false)
	}
	return n, err
}

// countingPool is a one-connection pool on db whose round trips are counted.
func countingPool(t *testing.T, db *testenv.DB) (*pgxpool.Pool, *atomic.Int64) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.MaxConns = 1
	trips := &atomic.Int64{}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &tripConn{Conn: c, trips: trips}, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, trips
}

// The first request through a SameTx route costs the same PostgreSQL round
// trips as the handler running its own BEGIN … COMMIT (the claim rides with
// the BEGIN, the stored response with the COMMIT); a replay costs two
// at most (BEGIN with the claim-or-read, ROLLBACK).
func TestSameTxRoundTrips(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	_, err := db.Pool.Exec(context.Background(), paymentsDDL)
	require.NoError(t, err)
	pool, trips := countingPool(t, db)
	edge, err := idempotency.New(pool, &idempotency.Config{Schema: db.Schema})
	require.NoError(t, err)
	const insert = `INSERT INTO payments (id, tenant, amount) VALUES ($1, $2, $3)`

	bare := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := pool.Begin(r.Context())
		if err == nil {
			_, err = tx.Exec(r.Context(), insert, uuid.New(), "acme", 1)
			if err == nil {
				err = tx.Commit(r.Context())
			}
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	mw, err := edge.Route(&idempotency.Route{Operation: "rt", Mode: idempotency.SameTx, SharedScope: true})
	require.NoError(t, err)
	wrapped := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.Tx(r)
		info, _ := idempotency.FromRequest(r)
		if _, err := tx.Exec(r.Context(), insert, info.ID(), "acme", 1); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	bareURL, mwURL := newServer(t, bare), newServer(t, wrapped)

	measure := func(url, key string) int64 {
		before := trips.Load()
		resp := post(t, url, "", key, `{"amount":1}`)
		require.Equal(t, http.StatusCreated, resp.status, resp.body)
		return trips.Load() - before
	}
	for i := range 3 { // warm the statement cache
		measure(bareURL, "")
		measure(mwURL, "warm-"+strconv.Itoa(i))
		measure(mwURL, "warm-"+strconv.Itoa(i))
	}
	const n = 5
	var bareTrips, newTrips, replayTrips int64
	for i := range n {
		bareTrips += measure(bareURL, "")
		newTrips += measure(mwURL, "key-"+strconv.Itoa(i))
		replayTrips += measure(mwURL, "key-"+strconv.Itoa(i))
	}
	t.Logf("round trips per request: bare handler %.1f, new key %.1f, replay %.1f",
		float64(bareTrips)/n, float64(newTrips)/n, float64(replayTrips)/n)
	require.Equal(t, int64(3*n), bareTrips, "bare: BEGIN, INSERT, COMMIT")
	require.Equal(t, bareTrips, newTrips, "a first request: BEGIN with the claim, INSERT, COMMIT with the response")
	// At most: more than two is the regression this guards against.
	require.LessOrEqual(t, replayTrips, int64(2*n), "a replay: BEGIN with the claim-or-read, ROLLBACK")
}
