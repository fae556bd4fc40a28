package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/idempotency"
)

// A payment endpoint in SameTx mode: the payment row, its outbox event and the
// stored response commit together; a retry replays the response.
func ExampleEdge_Route() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/postgres")
	if err != nil {
		log.Fatal(err)
	}
	edge, err := idempotency.New(pool, &idempotency.Config{Schema: "oncekit"})
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = edge.Run(ctx) }() // Prune of expired records, every RetentionInterval

	createPayment, err := edge.Route(&idempotency.Route{
		Operation: "create-payment",
		Mode:      idempotency.SameTx,
		Tenant:    func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil },
		Waiting:   &idempotency.Waiting{For: 2 * time.Second}, // a concurrent retry waits, then replays
		// A rejection for want of funds is not the key's last word: the
		// same key runs again once the balance allows.
		Responses: &idempotency.Responses{
			Rejections: map[string]idempotency.Rejection{"INSUFFICIENT_FUNDS": idempotency.Released},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", createPayment(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.Tx(r)
		info, _ := idempotency.FromRequest(r)
		paymentID := info.ID() // = oncekit.DeriveID(tenant, key): the same on every retry
		if _, err := tx.Exec(r.Context(), `INSERT INTO payments (id, amount) VALUES ($1, 100)`, paymentID); err != nil {
			http.Error(w, "cannot create payment", http.StatusInternalServerError) // 5xx: nothing stored
			return
		}
		// outbox.Enqueue(ctx, tx, broker.Message{ID: oncekit.DeriveID(paymentID.String(), "PaymentCreated"), ...})
		w.Header().Set("Location", "/payments/"+paymentID.String())
		w.WriteHeader(http.StatusCreated)
	})))
	_ = http.ListenAndServe("127.0.0.1:8080", mux)
}

// Keys are Structured Field strings; bare tokens (a plain UUID) are accepted.
func ExampleParseKey() {
	for _, v := range []string{`"order-42 \"retry\""`, `8e03978e-40d5-43e8-bc93-6894a57f9324`, `two words`} {
		key, err := idempotency.ParseKey(v)
		fmt.Printf("%q %v\n", key, err)
	}
	// Output:
	// "order-42 \"retry\"" <nil>
	// "8e03978e-40d5-43e8-bc93-6894a57f9324" <nil>
	// "" idempotency: invalid Idempotency-Key: ' ' is not allowed in an unquoted key
}

// The edge's DeriveID is the first link of the ID chain: the event ID derives
// from it, so a re-executed request emits the same event ID.
func ExampleDeriveID() {
	paymentID := oncekit.DeriveID("acme", "client-key-42")
	fmt.Println(paymentID == oncekit.DeriveID("acme", "client-key-42"))
	fmt.Println(oncekit.DeriveID(paymentID.String(), "PaymentCreated") ==
		oncekit.DeriveID(oncekit.DeriveID("acme", "client-key-42").String(), "PaymentCreated"))
	// Output:
	// true
	// true
}

// Each caller's keys live in its home region: the west edge forwards a
// request of a caller homed in the east to the east's edge, and the east
// edge, which lists no peer, refuses (421, Idempotency-Home-Region) a
// request of a caller homed in the west, so a retry never runs in two
// regions.
func ExampleHoming() {
	placement := map[string]string{"acme": "east", "globex": "west"} // a directory the regions share
	home := func(_ context.Context, account string) (string, error) {
		if region, ok := placement[account]; ok {
			return region, nil
		}
		return "", fmt.Errorf("account %q has no home region", account)
	}
	east, _ := url.Parse("https://payments.east.internal")
	route := &idempotency.Route{
		Operation: "create-payment",
		Tenant:    func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil },
		Homing:    &idempotency.Homing{Region: "west", Home: home, Peers: map[string]*url.URL{"east": east}},
	}
	fmt.Println(route.Homing.Region, idempotency.ValidRegion("eu-west-1"), idempotency.ValidRegion("EU West"))
	// Output: west true false
}

// A bulk import: each line runs once to an outcome under the request's
// key, its row written under an ID derived from the key and the line's
// own ID; a retry after a failure halfway replays the lines that ran and
// runs the rest.
func ExampleItem() {
	importLines := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var lines []struct{ ID, SKU string }
		if err := json.NewDecoder(r.Body).Decode(&lines); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		info, _ := idempotency.FromRequest(r)
		statuses := make(map[string]int, len(lines))
		for _, line := range lines {
			out, err := idempotency.Item(r, line.ID, func(ctx context.Context, tx pgx.Tx) (idempotency.ItemOutcome, error) {
				_, err := tx.Exec(ctx, `INSERT INTO stock_lines (id, sku) VALUES ($1, $2)`, info.ItemID(line.ID), line.SKU)
				return idempotency.ItemOutcome{Status: http.StatusCreated}, err
			})
			if err != nil { // the batch is released: its retry runs the lines that did not run
				http.Error(w, "retry the import with the same Idempotency-Key", http.StatusServiceUnavailable)
				return
			}
			statuses[line.ID] = out.Status
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusMultiStatus)
		_ = json.NewEncoder(w).Encode(statuses)
	})
	_ = importLines // behind edge.Route(&idempotency.Route{Operation: "import-lines", Command: ...})
}

// ValidateItems, called from Route.Command, refuses a batch whose item
// IDs are missing, too long, not UTF-8, hold control characters or
// repeat, before anything is stored.
func ExampleValidateItems() {
	fmt.Println(idempotency.ValidateItems([]string{"line-001", "line-002"}))
	fmt.Println(idempotency.ValidateItems([]string{"line-001", "line-001"}))
	fmt.Println(idempotency.ValidateItems([]string{"line-001", "line\x00"}))
	// Output:
	// <nil>
	// idempotency: batch item 1: the item ID repeats an earlier item's
	// idempotency: batch item 1: the item ID holds a control character
}
