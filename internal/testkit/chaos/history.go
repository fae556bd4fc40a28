package chaos

import (
	"slices"
	"sync"
	"time"
)

// Outcome is what a client knows about one operation once it stops retrying.
type Outcome string

// Outcomes, as a Jepsen history records them.
const (
	// OK: the service acknowledged the operation (a 2xx answer).
	OK Outcome = "ok"
	// Failed: the service definitely did not execute it (a 4xx answer that
	// is not "try again").
	Failed Outcome = "failed"
	// Unknown: every attempt ended without a definite answer (timeout,
	// reset, 5xx, 409 in progress): it may or may not have executed.
	Unknown Outcome = "unknown"
)

// Op is one client operation: a payment request under one Idempotency-Key,
// retried with the same key and body until it gets a definite answer or
// the client gives up.
type Op struct {
	Key     string
	Account string
	Amount  int64
	// Reuse marks a request that reuses the key of an acknowledged payment
	// with a different body: the service must refuse it, never execute it.
	Reuse bool
	// Reference is the payment's own reference (its business key with
	// Account).
	Reference string
	// RekeyOf, when set, marks a request that sends an acknowledged
	// payment (that key's) again under a new key, as a client that mints a
	// key per attempt does: the service must answer it from the first
	// payment, never make a second one.
	RekeyOf  string
	Outcome  Outcome
	Status   int // last HTTP status, 0 when none arrived
	Attempts int
	Start    time.Time
	End      time.Time
}

// History is the record of every operation, safe for concurrent clients.
type History struct {
	mu  sync.Mutex
	ops []Op
}

// Add records a finished operation.
func (h *History) Add(op Op) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, op)
}

// Len returns how many operations are recorded, without copying them.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ops)
}

// Ops returns a copy of the record.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.ops)
}

// acked returns a random acknowledged new payment, for a reuse.
func (h *History) acked(pick func(n int) int) (Op, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for range 8 {
		if len(h.ops) == 0 {
			return Op{}, false
		}
		op := h.ops[pick(len(h.ops))]
		if op.Outcome == OK && !op.Reuse && op.RekeyOf == "" {
			return op, true
		}
	}
	return Op{}, false
}
