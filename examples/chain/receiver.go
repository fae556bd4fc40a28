package main

import (
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/oncekit/oncekit/sideeffect/webhook"
)

// receiver is a webhook endpoint that verifies signatures and dedups on
// Idempotency-Key, counting calls and effects per key.
type receiver struct {
	key  []byte
	mu   sync.Mutex
	call map[string]int
	done map[string]int
}

func newReceiver() *receiver {
	key, err := webhook.ParseSecret(secret)
	if err != nil {
		panic(err)
	}
	return &receiver{key: key, call: map[string]int{}, done: map[string]int{}}
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if err := webhook.Verify(rc.key, r.Header.Get("webhook-id"), r.Header.Get("webhook-timestamp"),
		r.Header.Get("webhook-signature"), body, 5*time.Minute, time.Now()); err != nil {
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.call[key]++
	if rc.done[key] > 0 {
		w.Header().Set("Idempotent-Replayed", "true")
	} else {
		rc.done[key]++ // the email is sent here, once
	}
	w.Header().Set("Webhook-Ref", "msg-"+key[:8])
	w.WriteHeader(http.StatusOK)
}

func (rc *receiver) calls(key string) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.call[key]
}

func (rc *receiver) effects(key string) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.done[key]
}
