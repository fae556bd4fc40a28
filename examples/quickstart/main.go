// Command quickstart is the README's quickstart as a program: it wires a
// pool, the migrations, a JetStream stream, the outbox and its relay, an
// inbox consumer, the side-effect dispatcher and the HTTP edge, in the order
// a service does, then sends one request twice and shows that the payment,
// its event and its receipt each happen once.
//
// It uses DATABASE_URL (default postgres://postgres@127.0.0.1:5432/postgres),
// NATS_URL (default nats://127.0.0.1:4222) and ONCEKIT_SCHEMA (default
// oncekit).
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/migrations"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/sideeffect"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer) error {
	schema := getenv("ONCEKIT_SCHEMA", "oncekit")

	// A pool, and the service's own table.
	pool, err := pgxpool.New(ctx, getenv("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"))
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS quickstart_payments (id uuid PRIMARY KEY, amount int NOT NULL)`); err != nil {
		return fmt.Errorf("create the payments table (is PostgreSQL up?): %w", err)
	}
	// The quickstart has its own stream: examples/payments uses PAYMENTS (payments.>) on the same server.
	nc, err := nats.Connect(getenv("NATS_URL", nats.DefaultURL))
	if err != nil {
		return fmt.Errorf("connect to NATS: %w", err)
	}
	defer nc.Close()

	// A provider that counts its calls.
	var calls atomic.Int32
	email := sideeffect.ProviderFunc(func(ctx context.Context, c sideeffect.Call) (string, error) {
		calls.Add(1)
		fmt.Fprintf(out, "email provider: receipt for payment %s, Idempotency-Key %s…\n", c.SourceID, c.Key[:16])
		return "mail-" + c.Key[:8], nil
	})
	mux, daemons, err := setUp(ctx, pool, nc, schema, email, authenticate, callerOf)
	if err != nil {
		return err
	}
	dctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, daemon := range daemons {
		wg.Go(func() {
			if err := daemon(dctx); err != nil && !errors.Is(err, context.Canceled) {
				fmt.Fprintln(os.Stderr, "quickstart:", err)
			}
		})
	}
	defer func() { stop(); wg.Wait() }()
	ledger, err := sideeffect.New(&sideeffect.Config{Schema: schema})
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	api := &http.Server{Handler: mux}
	go func() { _ = api.Serve(ln) }()
	defer api.Close()

	// A client whose first response is lost sends the request again with the same key.
	key := rand.Text()
	for _, attempt := range []string{"first", "retry"} {
		status, replayed, err := post(ctx, "http://"+ln.Addr().String()+"/payments", key)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "POST /payments (%s) → %d Idempotent-Replayed=%q\n", attempt, status, replayed)
	}

	// Wait for the receipt: confirmed once.
	payment := oncekit.DeriveID(client, key).String()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		rows, err := ledger.List(ctx, pool, sideeffect.Filter{Kind: "email.receipt", State: sideeffect.StateConfirmed, Limit: 1000})
		if err != nil {
			return err
		}
		for _, r := range rows {
			if r.SourceID == payment {
				fmt.Fprintf(out, "receipt %s: provider called %d time(s), ref %s\n", r.State, calls.Load(), r.ProviderRef)
				if calls.Load() != 1 {
					return errors.New("the receipt was not sent exactly once")
				}
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("receipt not confirmed: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// setUp wires oncekit into a service, in the order a service does it, and
// returns its HTTP handler and the daemons to run. authenticate is the
// service's authentication, and callerOf reads the caller it admitted: the
// edge scopes keys by caller.
func setUp(ctx context.Context, pool *pgxpool.Pool, nc *nats.Conn, schema string, emailProvider sideeffect.Provider,
	authenticate func(http.Handler) http.Handler, callerOf func(*http.Request) (string, error),
) (http.Handler, []func(context.Context) error, error) {
	// 1. oncekit's tables, in their schema.
	if _, err := migrations.Up(ctx, pool, migrations.WithSchema(schema)); err != nil {
		return nil, nil, err
	}

	// 2. A JetStream stream; its dedup window absorbs republished event IDs.
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, err
	}
	if _, err := natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{Name: "QUICKSTART", Subjects: []string{"quickstart.>"}}); err != nil {
		return nil, nil, err
	}

	// 3. The outbox, and 4. its relay (normally the `oncekit relay` daemon).
	ob, err := outbox.New(&outbox.Config{Schema: schema})
	if err != nil {
		return nil, nil, err
	}
	pub, err := natsjs.NewPublisher(nc, nil)
	if err != nil {
		return nil, nil, err
	}
	relay, err := outbox.NewRelay(pool, ob, pub, nil) // ob's schema: stated once
	if err != nil {
		return nil, nil, err
	}

	// 5. A consumer: the claim and the handler's writes commit together.
	ledger, err := sideeffect.New(&sideeffect.Config{Schema: schema})
	if err != nil {
		return nil, nil, err
	}
	src, err := natsjs.NewSource(ctx, js, &natsjs.SourceConfig{Stream: "QUICKSTART", Durable: "receipts"})
	if err != nil {
		return nil, nil, err
	}
	consumer, err := inbox.NewConsumer(pool, src, inbox.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
			_, err := ledger.Record(ctx, tx, sideeffect.Effect{SourceID: msg.Key, Kind: "email.receipt", Payload: msg.Payload})
			return err
		}), &inbox.Config{Name: "receipts", Schema: schema, BatchSize: 100}) // batches form from what has arrived
	if err != nil {
		return nil, nil, err
	}

	// 6. The dispatcher calls each effect's provider with the effect's key.
	dispatcher, err := sideeffect.NewDispatcher(pool, ledger, map[string]sideeffect.Provider{"email.receipt": emailProvider}, nil)
	if err != nil {
		return nil, nil, err
	}

	// 7. The HTTP edge: payment, event and stored response commit together.
	edge, err := idempotency.New(pool, &idempotency.Config{Schema: schema})
	if err != nil {
		return nil, nil, err
	}
	createPayment, err := edge.Route(&idempotency.Route{Operation: "create-payment", Mode: idempotency.SameTx, Tenant: callerOf})
	if err != nil {
		return nil, nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", authenticate(createPayment(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.Tx(r)
		info, _ := idempotency.FromRequest(r)
		id := info.ID() // derived from the key: the same on every retry
		if _, err := tx.Exec(r.Context(), `INSERT INTO quickstart_payments (id, amount) VALUES ($1, 100)`, id); err != nil {
			http.Error(w, "could not create the payment", http.StatusServiceUnavailable) // a 5xx rolls back: a retry runs again
			return
		}
		if _, err := ob.Enqueue(r.Context(), tx, broker.Message{
			ID: oncekit.DeriveID(id.String(), "PaymentCreated"), Subject: "quickstart.payments.created",
			Key: id.String(), Payload: fmt.Appendf(nil, `{"payment":%q,"amount":100}`, id),
		}); err != nil {
			http.Error(w, "could not create the payment", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q}`, id)
	}))))
	consume := func(ctx context.Context) error { defer src.Close(); return consumer.Run(ctx) } // Close hands back what src holds
	return mux, []func(context.Context) error{relay.Run, consume, dispatcher.Run}, nil
}

// client is the one caller of the quickstart's API, and clientToken its
// credential.
const client, clientToken = "quickstart-client", "quickstart-token"

type callerKey struct{}

// authenticate stands for the service's own authentication: it admits a
// request with the client's bearer token and puts the caller in its context.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+clientToken {
			http.Error(w, "unauthenticated", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, client)))
	})
}

// callerOf is the edge's Tenant: the caller authenticate admitted.
func callerOf(r *http.Request) (string, error) {
	caller, _ := r.Context().Value(callerKey{}).(string)
	return caller, nil // "" (no caller) answers 403
}

// post sends the payment request with an Idempotency-Key.
func post(ctx context.Context, url, key string) (status int, replayed string, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewBufferString(`{"amount":100}`))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idempotency.HeaderKey, key)
	req.Header.Set("Authorization", "Bearer "+clientToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get(idempotency.HeaderReplayed), err
}

func getenv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
