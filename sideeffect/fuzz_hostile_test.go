package sideeffect_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/wait"
	"github.com/oncekit/oncekit/sideeffect"
	"github.com/oncekit/oncekit/sideeffect/webhook"
)

// answer is what the fuzzed provider answers one key.
type answer struct {
	status             int
	ref, ctype, header string
	body               []byte
}

// FuzzDispatchHostileAnswers answers a running dispatcher's webhook call
// (real HTTP, real PostgreSQL) with a random status, reference, content
// type, header and body, next to a neighbour effect answered 200. Its
// invariant: both effects settle (confirmed, failed or unknown: retryable
// answers run out of MaxAttempts) within bounded time, whatever was
// answered, and the neighbour is confirmed after one call.
func FuzzDispatchHostileAnswers(f *testing.F) {
	f.Add(200, "ref-1", "application/json", "X-Extra", []byte(`{"ok":true}`))
	f.Add(422, "r\xe9f", "text/html; charset=iso-8859-1", "", []byte("Requ\xeate refus\xe9e"))
	f.Add(503, "", "text/plain", "Retry-After", []byte("later"))
	f.Add(500, "ref\x00", "", "", []byte("\xff\xfe\x00 binary"))
	f.Add(302, "elsewhere", "", "Location", []byte(""))
	f.Add(429, "", "", "Retry-After", []byte("Wed, 21 Oct 2015 07:28:00 GMT"))
	b := setup(f)
	var answers sync.Map // key -> answer
	var calls sync.Map   // key -> *atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(webhook.HeaderIdempotencyKey)
		n, _ := calls.LoadOrStore(key, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		a := answer{status: http.StatusOK, ref: "neighbour"}
		if v, ok := answers.Load(key); ok {
			a = v.(answer)
		}
		if a.ctype != "" {
			w.Header()["Content-Type"] = []string{a.ctype}
		}
		if a.header != "" {
			w.Header()[a.header] = []string{string(a.body)}
		}
		w.Header()["Webhook-Ref"] = []string{a.ref}
		w.WriteHeader(a.status)
		_, _ = w.Write(a.body)
	}))
	f.Cleanup(srv.Close)
	hp, err := webhook.New(&webhook.Config{URL: srv.URL, Secret: testSecret, Timeout: 2 * time.Second})
	if err != nil {
		f.Fatal(err)
	}
	cfg := fastConfig(b)
	cfg.MaxAttempts, cfg.MaxRetryAfter = 2, 50*time.Millisecond
	start(f, b, map[string]sideeffect.Provider{"fuzz": hp}, cfg)
	var n atomic.Int64
	f.Fuzz(func(t *testing.T, status int, ref, ctype, header string, body []byte) {
		if status < 200 || status > 599 {
			t.Skip() // net/http writes only valid status codes
		}
		if len(body) > 1<<16 {
			body = body[:1<<16]
		}
		ctx := context.Background()
		i := n.Add(1)
		var keys []string
		if err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			for _, src := range []string{fmt.Sprintf("hostile-%d", i), fmt.Sprintf("neighbour-%d", i)} {
				r, err := b.ledger.Record(ctx, tx, sideeffect.Effect{SourceID: src, Kind: "fuzz", Payload: []byte(`{}`)})
				if err != nil {
					return err
				}
				keys = append(keys, r.Key)
			}
			answers.Store(keys[0], answer{status: status, ref: ref, ctype: ctype, header: header, body: body})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := wait.Until(wctx, 5*time.Millisecond, func(context.Context) error {
			hostile, neighbour := b.rowByKey(t, keys[0]), b.rowByKey(t, keys[1])
			if settled(hostile.State) && neighbour.State == sideeffect.StateConfirmed {
				return nil
			}
			return fmt.Errorf("hostile %s (%q), neighbour %s", hostile.State, hostile.LastError, neighbour.State)
		}); err != nil {
			t.Fatalf("not settled within 30 s: %v; answer %d %q %q %q %q", err, status, ref, ctype, header, body)
		}
		if v, _ := calls.Load(keys[1]); v.(*atomic.Int64).Load() != 1 {
			t.Fatalf("the neighbour was called %d times", v.(*atomic.Int64).Load())
		}
	})
}

func settled(s sideeffect.State) bool {
	return s == sideeffect.StateConfirmed || s == sideeffect.StateFailed || s == sideeffect.StateUnknown
}
