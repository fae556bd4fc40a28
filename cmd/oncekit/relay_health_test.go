package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// `oncekit relay`'s /healthz answers 503 with the cause while a statement
// of the relay is refused by PostgreSQL as sent (its role lost a grant
// under it), and 200 again once the grant is back and the event is out.
func TestRelayHealthzReportsAStatementRefused(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	role := testenv.NewRuntimeRole(t, db)
	n := testenv.NewNATS(t)
	stream := testenv.Name(t)
	addr := testenv.FreeAddr(t)
	var stderr testenv.SyncBuffer
	e := &env{stdout: io.Discard, stderr: &stderr, getenv: func(k string) string {
		return map[string]string{"DATABASE_URL": role.URL, "ONCEKIT_SCHEMA": db.Schema, "NATS_URL": n.URL}[k]
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, e, []string{"relay", "--listen", addr, "--stream", stream, "--subjects", stream + ".>",
			"--poll-interval", "100ms", "--lease", "2s"})
	}()
	t.Cleanup(func() {
		cancel()
		require.Equal(t, 0, <-done, stderr.String())
	})
	healthz := func() (int, string) {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close() //nolint:errcheck
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	require.Eventually(t, func() bool { c, _ := healthz(); return c == http.StatusOK }, 30*time.Second, 20*time.Millisecond, stderr.String())
	// Every partition held, so the grant goes away under running workers.
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close() //nolint:errcheck
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), "\noncekit_outbox_partitions_owned 16\n")
	}, 30*time.Second, 20*time.Millisecond, stderr.String())

	role.Exec(t, db, `REVOKE SELECT ON outbox FROM %s`)
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	msg := broker.Message{ID: uuid.New(), Subject: stream + ".x", Key: "k", Payload: []byte("p")}
	require.NoError(t, pgx.BeginFunc(context.Background(), db.Pool, func(tx pgx.Tx) error {
		_, err := ob.Enqueue(context.Background(), tx, msg)
		return err
	}))
	var body string
	require.Eventually(t, func() bool {
		var c int
		c, body = healthz()
		return c == http.StatusServiceUnavailable && strings.Contains(body, "permission denied for table outbox")
	}, 30*time.Second, 20*time.Millisecond, "last /healthz: %s\n%s", body, stderr.String())
	t.Logf("/healthz 503: %s", strings.TrimSpace(body))
	// Statements are listed by name: a lease lost and acquired again on a
	// loaded machine puts "acquire" (its cursor check reads the outbox)
	// before "batch".
	require.Contains(t, body, "unhealthy: oncekit: a statement PostgreSQL refuses as sent: ")
	require.Contains(t, body, "batch failing since")
	require.Contains(t, stderr.String(), "level=ERROR")

	role.Exec(t, db, `GRANT SELECT ON outbox TO %s`)
	require.Eventually(t, func() bool {
		c, _ := healthz()
		return c == http.StatusOK
	}, 30*time.Second, 20*time.Millisecond, stderr.String())
	st, err := n.JS.Stream(context.Background(), stream)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := st.Info(context.Background())
		return err == nil && info.State.Msgs == 1
	}, 30*time.Second, 20*time.Millisecond)
}
