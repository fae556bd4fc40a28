package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
)

// replayEnv is the service on a schema of its own and an embedded NATS
// server of its own (the stream's name is the service's, PAYMENTS).
type replayEnv struct {
	t      *testing.T
	schema string
	nats   string
}

func newReplayEnv(t *testing.T) *replayEnv {
	t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	require.NoError(t, err)
	go srv.Start()
	require.True(t, srv.ReadyForConnections(10*time.Second))
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	var b [4]byte
	_, _ = rand.Read(b[:])
	e := &replayEnv{t: t, schema: "payments_replay_" + hex.EncodeToString(b[:]), nats: srv.ClientURL()}
	t.Cleanup(func() {
		_ = e.run(context.Background(), nil, func(ctx context.Context, _ *config, pool *pgxpool.Pool, _ jetstream.JetStream) error {
			_, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+e.schema+`" CASCADE`)
			return err
		})
	})
	return e
}

// run runs f as `payments consume` with args would, on the env.
func (e *replayEnv) run(ctx context.Context, args []string, f func(context.Context, *config, *pgxpool.Pool, jetstream.JetStream) error) error {
	cfg, _, err := parseConfig("consume", append([]string{"-schema", e.schema, "-nats", e.nats}, args...), io.Discard)
	if err != nil {
		return usageError(err.Error())
	}
	return onStream(f)(ctx, cfg, nil)
}

// replay runs `payments consume` with args and returns its line of counts.
func (e *replayEnv) replay(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := e.run(ctx, args, func(ctx context.Context, cfg *config, pool *pgxpool.Pool, js jetstream.JetStream) error {
		return runReplay(ctx, cfg, pool, js, &out)
	})
	return strings.TrimSpace(out.String()), err
}

// After an asynchronous failover erased k payments' ledger entries, side
// effects and claims (acked at JetStream long before), `payments consume
// -replay-from` applies those k again, once, and a second run nothing.
func TestConsumeReplaysAWindow(t *testing.T) {
	const n, k = 30, 6
	e := newReplayEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	from := time.Now().Add(-time.Second)
	var paymentIDs []string
	require.NoError(t, e.run(ctx, nil, func(ctx context.Context, cfg *config, pool *pgxpool.Pool, js jetstream.JetStream) error {
		require.NoError(t, setupTables(ctx, pool, cfg))
		require.NoError(t, setupStream(ctx, js, 1))
		pub, err := natsjs.NewPublisher(js.Conn(), nil)
		require.NoError(t, err)
		for i := range n {
			ev := PaymentCreated{PaymentID: uuid.NewString(), Account: fmt.Sprint("acct-", i%3), Seq: int64(i/3 + 1), Amount: 100, Currency: "EUR"}
			payload, err := json.Marshal(ev)
			require.NoError(t, err)
			res := pub.Publish(ctx, []broker.Message{{ID: uuid.New(), Subject: subject, Key: ev.Account, Payload: payload}})
			require.NoError(t, res[0].Err)
			paymentIDs = append(paymentIDs, ev.PaymentID)
		}
		consumer, err := newConsumer(ctx, pool, js, cfg, quietLog())
		require.NoError(t, err)
		running, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- consumer.Run(running) }()
		require.Eventually(t, func() bool { return ledgerCount(t, pool, cfg) == n }, time.Minute, 20*time.Millisecond)
		stop()
		require.NoError(t, <-done)

		// The failover: k payments' transactions are gone.
		erased := []string{}
		for i := 0; i < n; i += n / k {
			erased = append(erased, paymentIDs[i])
		}
		_, err = pool.Exec(ctx, `DELETE FROM `+cfg.table("processed_messages")+` WHERE consumer = $1 AND message_id IN
			(SELECT event_id FROM `+cfg.table("ledger_entries")+` WHERE payment_id::text = ANY($2))`, consumerName, erased)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `DELETE FROM `+cfg.table("side_effects")+` WHERE source_id = ANY($1)`, erased)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `DELETE FROM `+cfg.table("ledger_entries")+` WHERE payment_id::text = ANY($1)`, erased)
		require.NoError(t, err)
		require.Equal(t, n-k, ledgerCount(t, pool, cfg))
		return nil
	}))

	line, err := e.replay("-replay-from", "1")
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("replay: seen=%d applied=%d absorbed=%d dead_lettered=0 dropped=0", n, k, n-k), line)
	line, err = e.replay("-replay-from", from.Format(time.RFC3339Nano), "-replay-to", "5")
	require.NoError(t, err)
	require.Equal(t, "replay: seen=5 applied=0 absorbed=5 dead_lettered=0 dropped=0", line)
	line, err = e.replay("-replay-from", "10m")
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("replay: seen=%d applied=0 absorbed=%d dead_lettered=0 dropped=0", n, n), line)

	require.NoError(t, e.run(ctx, nil, func(ctx context.Context, cfg *config, pool *pgxpool.Pool, _ jetstream.JetStream) error {
		for _, q := range []string{
			`SELECT count(DISTINCT payment_id) FROM ` + cfg.table("ledger_entries"),
			`SELECT count(*) FROM ` + cfg.table("ledger_entries"),
			`SELECT count(*) / 2 FROM ` + cfg.table("side_effects"),
		} {
			var got int
			require.NoError(t, pool.QueryRow(ctx, q).Scan(&got))
			require.Equal(t, n, got, q)
		}
		return nil
	}))

	// Bad windows are refused before anything runs.
	for _, args := range [][]string{{"-replay-from", "yesterday"}, {"-replay-to", "5"}, {"-replay-from", "0"}} {
		_, err := e.replay(args...)
		require.ErrorAs(t, err, new(usageError), "%v", args)
	}
	for args, want := range map[string]error{
		"2999-01-01T00:00:00Z": natsjs.ErrWindowInFuture,
		"1000":                 natsjs.ErrWindowInFuture,
	} {
		_, err := e.replay("-replay-from", args)
		require.ErrorIs(t, err, want, args)
	}
	_, err = e.replay("-replay-from", "9", "-replay-to", "3")
	require.ErrorIs(t, err, natsjs.ErrInvalidWindow)
}

func ledgerCount(t *testing.T, pool *pgxpool.Pool, cfg *config) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+cfg.table("ledger_entries")).Scan(&n)
	if err != nil && err != pgx.ErrNoRows {
		t.Errorf("ledger: %v", err)
	}
	return n
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
