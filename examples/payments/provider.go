package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncekit/oncekit/sideeffect/webhook"
)

// Call is one request the provider received, as its own records keep it.
type Call struct {
	Kind      string    `json:"kind"`
	Key       string    `json:"key"`
	PaymentID string    `json:"payment_id"`
	Attempt   string    `json:"attempt"`
	Executed  bool      `json:"executed"` // this call acted; every other call with its key was a replay
	Outcome   string    `json:"outcome"`  // executed, replayed, refused (503) or lost (acted, response dropped)
	At        time.Time `json:"at"`
}

// provider is a payment provider that honours idempotency keys the way
// Stripe does: the first request with a key acts, later ones replay its
// answer. It keeps a record of every call, served on GET /calls, so that a
// checker can count executions per payment from the provider's side.
type provider struct {
	failRate, loseRate float64
	loseNext           atomic.Int32 // the next n executions lose their response

	mu    sync.Mutex
	calls []Call
	done  map[string]string // key → reference of the execution
}

// refusedPage is the body of a refused call.
var refusedPage = []byte(strings.Repeat("<p>Service momentan\xe9ment indisponible \xe0 cause d\x00une maintenance. R\xe9essayez.</p>", 40))

func newProvider(failRate, loseRate float64) *provider {
	return &provider{failRate: failRate, loseRate: loseRate, done: map[string]string{}}
}

func runProvider(ctx context.Context, cfg *config, _ []string) error {
	return serve(ctx, cfg.Listen, newProvider(cfg.FailRate, cfg.LoseRate).handler())
}

func (p *provider) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /capture", p.act(kindCapture))
	mux.HandleFunc("POST /email", p.act(kindReceipt))
	mux.HandleFunc("GET /calls", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(p.record())
	})
	return mux
}

func (p *provider) act(kind string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			PaymentID string `json:"payment_id"`
		}
		data, err := io.ReadAll(r.Body)
		if err == nil {
			err = json.Unmarshal(data, &body)
		}
		key := r.Header.Get("Idempotency-Key")
		if err != nil || key == "" || body.PaymentID == "" {
			http.Error(w, "want a JSON body with payment_id and an Idempotency-Key", http.StatusBadRequest)
			return
		}
		call := Call{Kind: kind, Key: key, PaymentID: body.PaymentID, Attempt: r.Header.Get(webhook.HeaderAttempt), At: time.Now()}
		if rand.Float64() < p.failRate {
			call.Outcome = "refused"
			p.keep(call)
			// An error page as real providers send them: in a legacy
			// encoding, with a NUL, longer than a dispatcher keeps of it.
			w.Header().Set("Content-Type", "text/html; charset=iso-8859-1")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write(refusedPage)
			return
		}
		p.mu.Lock()
		ref, seen := p.done[key]
		if !seen {
			ref = fmt.Sprintf("%s-%d", kind, len(p.done)+1)
			p.done[key] = ref // the capture (or the email) happens here, once per key
			call.Executed = true
		}
		lose := !seen && (rand.Float64() < p.loseRate || p.loseNext.Add(-1) >= 0)
		call.Outcome = map[bool]string{true: "executed", false: "replayed"}[!seen]
		if lose {
			call.Outcome = "lost"
		}
		p.calls = append(p.calls, call)
		p.mu.Unlock()
		if lose {
			dropConnection(w)
			return
		}
		if seen {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		w.Header().Set("Webhook-Ref", ref)
		w.WriteHeader(http.StatusOK)
	}
}

func (p *provider) keep(c Call) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, c)
}

func (p *provider) record() []Call {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Call(nil), p.calls...)
}

// dropConnection closes the connection without an answer: the provider
// acted, the caller cannot know.
func dropConnection(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			_ = conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}
