package idempotency_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// FuzzEdgeHostileRequests sends the edge (SameTx and Separate routes on a
// real PostgreSQL) a request with a random method, key, content type and
// body, twice. Its invariant: every answer comes within bounded time,
// nothing panics, the status is one the edge or the handler gives, and a
// request the handler completed is replayed, not run again.
func FuzzEdgeHostileRequests(f *testing.F) {
	f.Add("POST", `"k1"`, "application/json", []byte(`{"amount":100}`))
	f.Add("POST", "", "application/json", []byte(`{}`))
	f.Add("PUT", `"\xff"`, "text/plain", []byte("\x00\xff"))
	f.Add("POST", `"k2"`, "application/json; charset=utf-8", []byte(`[[[[[[[[[[{"a":1e400}]]]]]]]]]]`))
	f.Add("PATCH", "k3", "application/merge-patch+json", []byte(`{"b":1,"a":{"d":[1,2],"c":"\ud83d\ude00"}}`))
	f.Add("POST", `"k4"`, "application/json", bytes.Repeat([]byte(`{"a":`), 600))
	db := testenv.NewDB(f)
	edge, err := idempotency.New(db.Pool, &idempotency.Config{Schema: db.Schema})
	if err != nil {
		f.Fatal(err)
	}
	var panics, runs atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
	})
	mux := http.NewServeMux()
	for _, mode := range modes {
		mw, err := edge.Route(&idempotency.Route{Operation: "fuzz-" + mode.String(), Mode: mode, MaxBodyBytes: 4096,
			Tenant: func(r *http.Request) (string, error) { return "fuzz", nil }})
		if err != nil {
			f.Fatal(err)
		}
		mux.Handle("/"+mode.String(), mw(handler))
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				panics.Add(1)
				w.WriteHeader(http.StatusInternalServerError)
			}
		}()
		mux.ServeHTTP(w, r)
	}))
	f.Cleanup(srv.Close)
	client := &http.Client{Timeout: 10 * time.Second}
	var n atomic.Int64
	f.Fuzz(func(t *testing.T, method, key, ctype string, body []byte) {
		if method == "" || method == "GET" || method == "HEAD" {
			t.Skip() // the edge guards unsafe methods; a GET carries no body to fingerprint
		}
		// A key of its own per input, unless the input's is empty (no key).
		if key != "" {
			key = fmt.Sprintf("%s-%d", key, n.Add(1))
		}
		for _, mode := range modes {
			var first int
			for attempt := range 2 {
				req, err := http.NewRequest(method, srv.URL+"/"+mode.String(), bytes.NewReader(body))
				if err != nil {
					t.Skip() // not a request net/http can send
				}
				req.Header[idempotency.HeaderKey] = []string{key}
				req.Header["Content-Type"] = []string{ctype}
				before := runs.Load()
				start := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					t.Skipf("not sendable: %v", err) // a header net/http refuses to write
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if d := time.Since(start); d > 5*time.Second {
					t.Fatalf("%s answered in %v", mode, d)
				}
				switch resp.StatusCode {
				case http.StatusCreated, http.StatusBadRequest, http.StatusConflict, http.StatusRequestEntityTooLarge,
					http.StatusUnprocessableEntity:
				default:
					t.Fatalf("%s attempt %d: unexpected status %d", mode, attempt, resp.StatusCode)
				}
				if attempt == 0 {
					first = resp.StatusCode
				} else if first == http.StatusCreated {
					if resp.StatusCode != http.StatusCreated || resp.Header.Get(idempotency.HeaderReplayed) != "true" || runs.Load() != before {
						t.Fatalf("%s: a completed request was not replayed: %d %q", mode, resp.StatusCode, resp.Header.Get(idempotency.HeaderReplayed))
					}
				}
			}
		}
		if panics.Load() > 0 {
			t.Fatal("the edge panicked")
		}
	})
}
