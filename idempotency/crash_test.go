package idempotency_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/crashpoint"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

const (
	helperEnv       = "ONCEKIT_EDGE_HELPER"
	helperSchemaEnv = "ONCEKIT_EDGE_SCHEMA"
	helperModeEnv   = "ONCEKIT_EDGE_MODE"
	// crashLease must outlast the time from the helper's claim to the
	// test's first retry (process exit, checks, a new server) on a loaded
	// machine, or that retry recovers instead of answering 409.
	crashLease = 3 * time.Second
)

// TestHelperProcess is not a test: re-executed with ONCEKIT_EDGE_HELPER=1, it
// is the "user process", an HTTP server with the Separate-mode middleware
// that a crash test kills at a crash point.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("helper process for the crash tests")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	edge, err := idempotency.New(pool, &idempotency.Config{Schema: os.Getenv(helperSchemaEnv)})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	route, h := crashRoute(), &harness{}
	if os.Getenv(helperModeEnv) == idempotency.SameTx.String() {
		route = sameTxRoute()
		if h.event, err = paymentEvents(os.Getenv(helperSchemaEnv)); err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
	}
	mw, err := edge.Route(route)
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw(h.createPayment(pool)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	fmt.Println("ADDR", ln.Addr().String())
	_ = http.Serve(ln, mux)
	os.Exit(0)
}

func crashRoute() *idempotency.Route {
	return &idempotency.Route{Operation: "create-payment", Mode: idempotency.Separate, Lease: crashLease, Tenant: tenantFromHeader}
}

// startHelper runs the helper server in a subprocess armed to die at point and
// returns its base URL.
func startHelper(t *testing.T, db *testenv.DB, mode idempotency.Mode, point string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", "DATABASE_URL="+db.URL, helperSchemaEnv+"="+db.Schema,
		helperModeEnv+"="+mode.String(), crashpoint.EnvVar+"="+point)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if addr, ok := strings.CutPrefix(sc.Text(), "ADDR "); ok {
			go func() { // drain the rest
				for sc.Scan() {
				}
			}()
			return cmd, "http://" + addr
		}
	}
	t.Fatalf("helper process exited without serving: %v", sc.Err())
	return nil, ""
}

// Case 8: the process is SIGKILLed mid-request in Separate mode (after its
// claim committed, inside the handler after its write, or after the handler
// returned but before the response was stored). The claim stays in_progress; retries answer 409 until its lease
// ends; then exactly one of several concurrent retries takes ownership (token
// 2) and re-runs the handler, whose DeriveID-keyed write makes the business
// effect exist once.
func TestCrashMidHandlerRecoversOnce(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		point       string
		rowsAtCrash int
	}{
		{"idempotency.after-claim", 0},
		{"idempotency.mid-handler", 1},
		{"idempotency.before-store", 1},
	} {
		t.Run(c.point, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testenv.NewDB(t)
			_, err := db.Pool.Exec(ctx, paymentsDDL)
			require.NoError(t, err)
			cmd, url := startHelper(t, db, idempotency.Separate, c.point)
			postAndDie(t, cmd, url)

			require.Equal(t, 1, count(t, db, `SELECT count(*) FROM idempotency_keys WHERE state = 'in_progress' AND token = 1`))
			require.Equal(t, c.rowsAtCrash, count(t, db, `SELECT count(*) FROM payments`))

			// The retries go to a fresh server process (here: in the test).
			h := newHarnessOn(t, db, *crashRoute(), nil)
			resp := h.post(t, "acme", "pay-1", `{"amount":100}`)
			require.Equal(t, http.StatusConflict, resp.status, "the lease has not run out yet")
			require.Equal(t, "1", resp.header.Get("Retry-After"))
			require.Zero(t, h.runs.Load())
			require.Eventually(t, func() bool {
				return count(t, db, `SELECT count(*) FROM idempotency_keys WHERE locked_until < now()`) == 1
			}, 10*time.Second, 20*time.Millisecond)

			// A different request under the key is still refused, and does not recover it.
			require.Equal(t, http.StatusUnprocessableEntity, h.post(t, "acme", "pay-1", `{"amount":5}`).status)

			const n = 10
			var wg sync.WaitGroup
			results := make([]response, n)
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					results[i] = postInBackground(t, h.srv.URL+"/payments", "acme", "pay-1", `{"amount":100}`)
				}()
			}
			wg.Wait()
			executed := 0
			for _, r := range results {
				switch {
				case r.status == http.StatusCreated && r.header.Get(idempotency.HeaderReplayed) == "":
					executed++
				case r.status == http.StatusCreated, r.status == http.StatusConflict:
				default:
					t.Fatalf("unexpected answer %d: %s", r.status, r.body)
				}
			}
			require.Equal(t, 1, executed)
			require.EqualValues(t, 1, h.runs.Load(), "recovery re-ran the handler exactly once")
			require.Equal(t, 1, count(t, db, `SELECT count(*) FROM idempotency_keys
				WHERE state = 'completed' AND token = 2 AND recoveries = 1 AND status_code = 201`))
			require.Equal(t, 1, count(t, db, `SELECT count(*) FROM payments`), "the business effect exists once")

			again := h.post(t, "acme", "pay-1", `{"amount":100}`)
			require.Equal(t, http.StatusCreated, again.status)
			require.Equal(t, "true", again.header.Get(idempotency.HeaderReplayed))
			require.EqualValues(t, 1, h.runs.Load())
		})
	}
}

// postAndDie sends the request the helper process dies in, and checks that it
// died of SIGKILL.
func postAndDie(t *testing.T, cmd *exec.Cmd, url string) {
	t.Helper()
	_, err := tryPost(url+"/payments", "acme", "pay-1", `{"amount":100}`)
	require.Error(t, err, "the process should have died mid-request")
	err = cmd.Wait()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "helper: %v", err)
	ws := exit.Sys().(syscall.WaitStatus)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "helper exit: %v", err)
}

// An owner that lost its claim (another request recovered it while this one
// could not renew its lease: here the takeover is simulated in SQL) has its
// handler context cancelled with ErrOwnershipLost, and its late response is
// not stored over the new owner's claim.
func TestFencedOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newHarness(t, idempotency.Route{}, nil)
	mw, err := h.edge.Route(&idempotency.Route{Operation: "slow", Lease: 90 * time.Millisecond, SharedScope: true})
	require.NoError(t, err)
	causes := make(chan error, 1)
	url := newServer(t, mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		causes <- context.Cause(r.Context())
		w.WriteHeader(http.StatusCreated)
	})))
	done := make(chan response, 1)
	go func() { done <- postInBackground(t, url+"/", "", "k", `{}`) }()
	require.Eventually(t, func() bool {
		tag, err := h.db.Pool.Exec(ctx, `UPDATE idempotency_keys SET token = token + 1, recoveries = recoveries + 1
			WHERE key = $1 AND state = 'in_progress'`, idempotency.StoredKey("k"))
		if err != nil { // not the test's goroutine: no require here
			t.Errorf("simulated takeover: %v", err)
			return false
		}
		return tag.RowsAffected() == 1
	}, 5*time.Second, 5*time.Millisecond)
	require.ErrorIs(t, <-causes, idempotency.ErrOwnershipLost)
	require.Equal(t, http.StatusCreated, (<-done).status) // the stale owner's answer still reaches its client
	require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE key = $1 AND state = 'in_progress' AND token = 2`, idempotency.StoredKey("k")))
}
