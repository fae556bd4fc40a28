package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/outbox"
)

// PaymentRequest is the body of POST /payments.
type PaymentRequest struct {
	Account  string `json:"account"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	// Reference is the client's own reference of the payment (an invoice
	// number), unique per account: the payment's business key. Optional.
	Reference string `json:"reference,omitempty"`
}

// PaymentCreated is the event the API publishes through the outbox, keyed by
// account so that each account's payments are consumed in order.
type PaymentCreated struct {
	PaymentID string `json:"payment_id"`
	Account   string `json:"account"`
	Seq       int64  `json:"seq"`
	Amount    int64  `json:"amount"`
	Currency  string `json:"currency"`
}

// PaymentResponse is the API's answer, stored and replayed by the edge.
type PaymentResponse struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Seq     int64  `json:"seq"`
	Amount  int64  `json:"amount"`
}

func runAPI(ctx context.Context, cfg *config, pool *pgxpool.Pool) error {
	h, err := newAPI(pool, cfg, slog.Default())
	if err != nil {
		return err
	}
	return serve(ctx, cfg.Listen, h)
}

// newAPI builds the payment endpoint: the edge claims the key in a
// transaction, the handler writes the payment and its event in it, and the
// edge stores the response with the same commit.
func newAPI(pool *pgxpool.Pool, cfg *config, log *slog.Logger) (http.Handler, error) {
	ob, err := outbox.New(&outbox.Config{Schema: cfg.Schema, Logical: cfg.Logical})
	if err != nil {
		return nil, err
	}
	edge, err := idempotency.New(pool, &idempotency.Config{Schema: cfg.Schema, Logger: log})
	if err != nil {
		return nil, err
	}
	route := &idempotency.Route{Operation: operation, Mode: idempotency.SameTx, Tenant: callerOf, BusinessKey: &idempotency.BusinessKey{Of: paymentReference}}
	create := createPayment(ob, cfg)
	switch cfg.Broken {
	case brokenStoreAfterCommit:
		route.Mode, create = idempotency.Separate, createPaymentApart(pool, ob, cfg)
	case brokenKeyOnly:
		route.BusinessKey = nil
	}
	withKey, err := edge.Route(route)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", authenticate(parseTokens(os.Getenv("PAYMENTS_API_TOKENS")), withKey(create)))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := pool.Ping(r.Context()); err != nil {
			http.Error(w, "database unreachable", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux, nil
}

func createPayment(ob *outbox.Outbox, cfg *config) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		req, ok := readPayment(w, r)
		if !ok {
			return
		}
		if cfg.Broken == brokenKeyOnly {
			req.Reference = "" // nothing unique but the key
		}
		tx, _ := idempotency.Tx(r)
		info, _ := idempotency.FromRequest(r)
		resp, err := insertPayment(r.Context(), tx, ob, cfg, info.ID().String(), req)
		writeCreated(w, resp, err)
	}
}

// paymentReference is the edge's business key: the account and the
// client's reference of the payment. A payment sent again under a new
// Idempotency-Key gets the first one's answer and is not made twice.
func paymentReference(_ *http.Request, body []byte) (string, error) {
	var req PaymentRequest
	if err := json.Unmarshal(body, &req); err != nil || req.Reference == "" {
		return "", nil // no reference (or no JSON: the handler answers 400)
	}
	return req.Account + "\x00" + req.Reference, nil
}

// readPayment decodes and checks the request's body, or answers 400.
func readPayment(w http.ResponseWriter, r *http.Request) (PaymentRequest, bool) {
	var req PaymentRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Account == "" || req.Amount <= 0 || len(req.Currency) != 3 {
		http.Error(w, `want {"account": "...", "amount": >0, "currency": "EUR"}`, http.StatusBadRequest)
		return req, false
	}
	return req, true
}

// errReferenceUsed is insertPayment's answer for a reference the account
// used for another payment.
var errReferenceUsed = errors.New("this account has a payment with this reference")

// writeCreated answers 201 with the payment, 409 when its reference is
// taken, or 503 for any other error.
func writeCreated(w http.ResponseWriter, resp PaymentResponse, err error) {
	if errors.Is(err, errReferenceUsed) {
		// Stored and replayed: the answer is final.
		http.Error(w, err.Error(), http.StatusConflict)
		return
	}
	if err != nil {
		// 5xx: the edge rolls back, and a retry with the same body executes.
		http.Error(w, "could not create the payment", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/payments/"+resp.ID)
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(resp)
}

// insertPayment numbers the payment within its account (the account row's
// lock orders concurrent payments of one account by commit), writes it, and
// enqueues its event: all in the edge's transaction.
func insertPayment(ctx context.Context, tx pgx.Tx, ob *outbox.Outbox, cfg *config, id string, req PaymentRequest) (PaymentResponse, error) {
	if cfg.Broken == brokenPaymentCommitLocal {
		if err := commitLocal(ctx, tx); err != nil {
			return PaymentResponse{}, err
		}
	}
	if req.Reference != "" {
		// The backstop behind the edge's business key (kept for a while
		// only): a reference once used is refused for good. Two racing
		// requests meet the unique index instead; the loser rolls back.
		var used bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+cfg.table("payments")+`
			WHERE account = $1 AND reference = $2)`, req.Account, req.Reference).Scan(&used); err != nil {
			return PaymentResponse{}, err
		}
		if used {
			return PaymentResponse{}, errReferenceUsed
		}
	}
	var seq int64
	if err := tx.QueryRow(ctx, `INSERT INTO `+cfg.table("accounts")+` AS a (id, seq) VALUES ($1, 1)
		ON CONFLICT (id) DO UPDATE SET seq = a.seq + 1 RETURNING seq`, req.Account).Scan(&seq); err != nil {
		return PaymentResponse{}, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+cfg.table("payments")+` (id, account, seq, amount, currency, reference)
		VALUES ($1, $2, $3, $4, $5, nullif($6, ''))`, id, req.Account, seq, req.Amount, req.Currency, req.Reference); err != nil {
		return PaymentResponse{}, err
	}
	event, err := json.Marshal(PaymentCreated{PaymentID: id, Account: req.Account, Seq: seq, Amount: req.Amount, Currency: req.Currency})
	if err != nil {
		return PaymentResponse{}, err
	}
	if _, err := ob.Enqueue(ctx, tx, broker.Message{
		ID:      oncekit.DeriveID(id, "PaymentCreated"), // the same on every replay of this payment
		Subject: subject,
		Key:     req.Account,
		Payload: event,
	}); err != nil {
		return PaymentResponse{}, err
	}
	return PaymentResponse{ID: id, Account: req.Account, Seq: seq, Amount: req.Amount}, nil
}

// serve runs h on addr until ctx ends.
func serve(ctx context.Context, addr string, h http.Handler) error {
	// Every phase of a connection is bounded: an idle or slow client
	// cannot hold one.
	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 60 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		shut, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(shut); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
}
