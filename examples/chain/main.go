// Command chain runs oncekit's whole chain on the local services, with a
// client that retries:
//
//	POST /orders (Idempotency-Key) ──► order row + OrderPlaced event, one tx
//	relay ──► JetStream ──► inbox consumer records a receipt email, same tx
//	dispatcher ──► webhook receiver (Idempotency-Key, Standard Webhooks)
//	drift ──► every order has exactly one receipt
//
// The client sends each order twice (a lost response, retried) and one
// event reaches the broker a second time as a new message: every effect still
// happens once. It uses DATABASE_URL and NATS_URL (default
// nats://127.0.0.1:4222, or an embedded server when nothing answers), and
// works in the schema ONCEKIT_SCHEMA (default oncekit_demo).
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/drift"
	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/migrations"
	"github.com/oncekit/oncekit/oncekittest"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/sideeffect"
	"github.com/oncekit/oncekit/sideeffect/webhook"
)

const (
	orders  = 3
	secret  = "whsec_ZGVtby1zZWNyZXQtZG8tbm90LXVzZQ=="
	subject = "chain.orders.placed"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "chain:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	schema := getenv("ONCEKIT_SCHEMA", "oncekit_demo")
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pool, err := pgxpool.New(ctx, getenv("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"))
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := migrations.Up(ctx, pool, migrations.WithSchema(schema)); err != nil {
		return fmt.Errorf("migrate (is PostgreSQL up?): %w", err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS "`+schema+`".demo_orders (
		id uuid PRIMARY KEY, item text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}

	nc, stopNATS, err := oncekittest.Connect(getenv("NATS_URL", "nats://127.0.0.1:4222"))
	if err != nil {
		return err
	}
	defer stopNATS()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if _, err := natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{Name: "ONCEKIT_CHAIN", Subjects: []string{"chain.>"}}); err != nil {
		return err
	}

	// The external email provider: dedups on Idempotency-Key, as good providers do.
	receiver := newReceiver()
	mail := httptest.NewServer(receiver)
	defer mail.Close()

	// 1. The HTTP edge: the order row and its event commit with the stored response.
	ob, err := outbox.New(&outbox.Config{Schema: schema})
	if err != nil {
		return err
	}
	edge, err := idempotency.New(pool, &idempotency.Config{Schema: schema, Logger: quiet})
	if err != nil {
		return err
	}
	createOrder, err := edge.Route(&idempotency.Route{Operation: "create-order", Mode: idempotency.SameTx})
	if err != nil {
		return err
	}
	api := httptest.NewServer(createOrder(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.Tx(r)
		info, _ := idempotency.FromRequest(r)
		orderID := info.ID() // the same on every retry of this key
		if _, err := tx.Exec(r.Context(), `INSERT INTO "`+schema+`".demo_orders (id, item) VALUES ($1, 'book')`, orderID); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, err := ob.Enqueue(r.Context(), tx, broker.Message{
			ID: oncekit.DeriveID(orderID.String(), "OrderPlaced"), Subject: subject, Key: orderID.String(),
			Payload: fmt.Appendf(nil, `{"order":%q}`, orderID),
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Location", "/orders/"+orderID.String())
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q}`, orderID)
	})))
	defer api.Close()

	// 2. The relay, the consumer and the dispatcher (normally three daemons).
	pub, err := natsjs.NewPublisher(nc, nil)
	if err != nil {
		return err
	}
	relay, err := outbox.NewRelay(pool, pub, &outbox.RelayConfig{Schema: schema, Logger: quiet})
	if err != nil {
		return err
	}
	src, err := natsjs.NewSource(ctx, js, &natsjs.SourceConfig{Stream: "ONCEKIT_CHAIN", Durable: "receipts", FilterSubjects: []string{subject}})
	if err != nil {
		return err
	}
	ledger, err := sideeffect.New(&sideeffect.Config{Schema: schema})
	if err != nil {
		return err
	}
	consumer, err := inbox.NewConsumer(pool, src, inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		// The receipt is recorded in the consumer's transaction; the
		// dispatcher sends it later with key DeriveKey(source, kind).
		_, err := ledger.Record(ctx, tx, sideeffect.Effect{SourceID: m.Key, Kind: "email.receipt", Payload: m.Payload})
		return err
	}), &inbox.Config{Name: "receipts", Schema: schema, Logger: quiet})
	if err != nil {
		return err
	}
	email, err := webhook.New(&webhook.Config{URL: mail.URL, Secret: secret})
	if err != nil {
		return err
	}
	dispatcher, err := sideeffect.NewDispatcher(pool, map[string]sideeffect.Provider{"email.receipt": email},
		&sideeffect.DispatcherConfig{Schema: schema, Logger: quiet, PollInterval: 20 * time.Millisecond})
	if err != nil {
		return err
	}
	bg, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, daemon := range []func(context.Context) error{relay.Run, consumer.Run, dispatcher.Run} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := daemon(bg); err != nil && !errors.Is(err, context.Canceled) {
				quiet.Error("daemon stopped", "err", err)
			}
		}()
	}
	defer func() { stop(); wg.Wait() }()

	// 3. A client whose responses get lost: every order is sent twice.
	run := hex.EncodeToString(randomBytes(4))
	var ids []string
	for i := range orders {
		key := fmt.Sprintf("order-%s-%d", run, i)
		first, body, err := post(ctx, api.URL, key)
		if err != nil {
			return err
		}
		again, body2, err := post(ctx, api.URL, key)
		if err != nil {
			return err
		}
		fmt.Printf("POST /orders key=%s → %d, retry → %d Idempotent-Replayed=%s same body=%v\n",
			key, first.StatusCode, again.StatusCode, again.Header.Get(idempotency.HeaderReplayed), bytes.Equal(body, body2))
		ids = append(ids, idempotency.DeriveID("", key).String())
	}

	// 4. One event arrives a second time as a new broker message (a replay
	// after JetStream's dedup window, a copy from another stream): the inbox
	// claim absorbs it.
	copyMsg := natsjs.NATSMsg(broker.Message{ID: oncekit.DeriveID(ids[0], "OrderPlaced"), Subject: subject, Key: ids[0], Payload: []byte(`{}`)})
	copyMsg.Header.Del(broker.HeaderMsgID) // not deduped by JetStream: stored as a new message
	if _, err := js.PublishMsg(ctx, copyMsg); err != nil {
		return err
	}

	// 5. Wait until every receipt is confirmed by the provider.
	deadline := time.Now().Add(60 * time.Second)
	for {
		var confirmed int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".side_effects
			WHERE kind = 'email.receipt' AND state = 'confirmed' AND source_id = ANY($1)`, ids).Scan(&confirmed); err != nil {
			return err
		}
		if confirmed == len(ids) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d receipts confirmed after 60s", confirmed, len(ids))
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitFor(func() bool { return consumer.Stats().Duplicates == 1 })
	st := consumer.Stats()
	fmt.Printf("inbox: processed=%d duplicates=%d\n", st.Processed, st.Duplicates)
	for _, id := range ids {
		fmt.Printf("order %s: receipt delivered %d time(s), calls %d, all with key %s…\n",
			id, receiver.effects(sideeffect.Key(id, "email.receipt")), receiver.calls(sideeffect.Key(id, "email.receipt")), sideeffect.Key(id, "email.receipt")[:12])
	}

	// 6. Drift: every order has exactly one receipt, and the chain is healthy.
	checker, err := drift.New(pool, &drift.Config{Schema: schema, Logger: quiet, Rules: []drift.Rule{
		drift.ExpectEffects("order_receipts", "email.receipt", `SELECT id FROM "`+schema+`".demo_orders`),
	}})
	if err != nil {
		return err
	}
	rep, err := checker.Run(ctx)
	if err != nil {
		return err
	}
	fmt.Println()
	if err := rep.WriteTable(os.Stdout); err != nil {
		return err
	}
	if rep.Drifted() {
		return errors.New("drift found")
	}
	for _, id := range ids {
		if receiver.effects(sideeffect.Key(id, "email.receipt")) != 1 {
			return fmt.Errorf("order %s: receipt not delivered exactly once", id)
		}
	}
	fmt.Println("\ndone: each order created once, each event consumed once, each receipt sent once")
	return nil
}

// waitFor polls cond for up to ten seconds.
func waitFor(cond func() bool) {
	for end := time.Now().Add(10 * time.Second); !cond() && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
	}
}

func post(ctx context.Context, url, key string) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/orders", bytes.NewBufferString(`{"item":"book"}`))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idempotency.HeaderKey, `"`+key+`"`)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

func getenv(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
