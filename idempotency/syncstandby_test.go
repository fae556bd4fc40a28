package idempotency_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// A completed record can be visible on a primary before its synchronous
// standby has it (its commit's wait cancelled, as pgx does when a
// connection breaks during a COMMIT). A retry is answered from it only
// once the standby has it: a replay before, and a failover erasing the
// record with the payment, would tell the client that a request succeeded
// whose effects are gone.
func TestReplayWaitsForTheSynchronousStandby(t *testing.T) {
	ctx := context.Background()
	pair := testenv.NewSyncPair(t)
	db := pair.DB
	_, err := db.Pool.Exec(ctx, paymentsDDL)
	require.NoError(t, err)
	for name, mode := range map[string]idempotency.Mode{"same-tx": idempotency.SameTx, "separate": idempotency.Separate} {
		t.Run(name, func(t *testing.T) {
			h := newHarnessOn(t, db, idempotency.Route{Operation: "pay-" + name, Mode: mode}, nil)
			pair.StopStandby(t)
			key := "key-" + name

			// The first request's commits wait for the standby; each wait
			// is cancelled: the record is completed on the primary alone.
			first := make(chan response, 1)
			go func() { first <- postInBackground(t, h.srv.URL+"/payments", "acme", key, `{"amount": 5}`) }()
			var answered response
			require.Eventually(t, func() bool {
				select {
				case answered = <-first:
					return true
				default:
				}
				_, err := db.Pool.Exec(ctx, `SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`)
				require.NoError(t, err)
				return false
			}, 30*time.Second, 20*time.Millisecond)
			require.Equal(t, http.StatusCreated, answered.status)

			retry := make(chan response, 1)
			go func() { retry <- postInBackground(t, h.srv.URL+"/payments", "acme", key, `{"amount": 5}`) }()
			// It waits for the standby: in its barrier's commit (or, in
			// Separate mode, already in its claim's, which writes).
			testenv.WaitSyncRep(t, db.Pool, func(int, string) bool { return true })
			select {
			case r := <-retry:
				t.Fatalf("replayed %d before the standby had the record", r.status)
			default:
			}
			pair.StartStandby(t)
			select {
			case r := <-retry:
				require.Equal(t, http.StatusCreated, r.status)
				require.Equal(t, "true", r.header.Get(idempotency.HeaderReplayed))
			case <-time.After(30 * time.Second):
				t.Fatal("no replay once the standby was back")
			}
			require.EqualValues(t, 1, h.runs.Load(), "the handler ran once")
		})
	}
}
