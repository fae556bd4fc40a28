package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/broker"
)

// hostileSubject is where the payments example's events are published: its
// consumer reads every message on it.
const hostileSubject = "payments.created"

// hostilePrefix starts the payload of every hostile message, so that its
// dead letter is told apart from a payment's.
const hostilePrefix = "hostile-"

// Hostile records the malformed messages a run published next to the
// payments' events, as a buggy or malicious publisher would: an ID that is
// not UTF-8, an ID of 5,000 bytes, no ID, and a payment event ID with a NUL
// in a header and a payload that is not JSON. Each must end in exactly one
// dead letter, and none may disturb a payment. A message without an ID has
// nothing its dead letter can be deduplicated on: a consumer killed between
// the dead letter's commit and the ack writes another on the redelivery, so
// such a message ends in at least one.
type Hostile struct {
	mu    sync.Mutex
	acked map[string]bool // published and acknowledged, by payload
	maybe map[string]bool // published without an answer: stored or not
	noID  map[string]bool // published without an ID
}

// Counts returns how many hostile messages were acknowledged and how many
// were sent without an answer.
func (h *Hostile) Counts() (acked, maybe int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.acked), len(h.maybe)
}

// hostileMsg is the n-th hostile message, of a kind chosen by n.
func hostileMsg(n int) *nats.Msg {
	payload := fmt.Sprintf("%s%d not json", hostilePrefix, n)
	m := nats.NewMsg(hostileSubject)
	m.Data = []byte(payload)
	switch n % 4 {
	case 0:
		m.Header.Set(broker.HeaderMsgID, fmt.Sprintf("id-%d-\xff\xfe", n))
	case 1:
		m.Header.Set(broker.HeaderMsgID, uuid.NewString())
		m.Header.Set(broker.HeaderEventID, fmt.Sprintf("%d-%s", n, strings.Repeat("x", 5000)))
	case 2:
		// No ID at all: JetStream stores it, the consumer has nothing to
		// claim.
	default:
		m.Header.Set(broker.HeaderMsgID, uuid.NewString())
		m.Header.Set("X-Forwarded", "a\x00b")
		m.Header.Set("X-Terminal", "\x1b]0;pwned\x07")
	}
	return m
}

// hostileLoop publishes a hostile message every every until ctx ends,
// through the cluster at urls, and records each in h.
func hostileLoop(ctx context.Context, urls []string, every time.Duration, h *Hostile) {
	h.mu.Lock()
	h.acked, h.maybe, h.noID = map[string]bool{}, map[string]bool{}, map[string]bool{}
	h.mu.Unlock()
	nc, err := nats.Connect(strings.Join(urls, ","), nats.MaxReconnects(-1))
	if err != nil {
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		m := hostileMsg(n)
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := js.PublishMsg(pctx, m)
		cancel()
		h.mu.Lock()
		h.noID[string(m.Data)] = m.Header.Get(broker.HeaderMsgID) == ""
		if err == nil {
			h.acked[string(m.Data)] = true
		} else {
			h.maybe[string(m.Data)] = true // a node kill: stored or not
		}
		h.mu.Unlock()
	}
}
