package main

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/oncekit/oncekit/broker"
)

// crashMarkedNotPublished is the crash point of the relay-marks-before-ack
// build: a batch the relay has marked published is about to be sent.
const crashMarkedNotPublished = "payments.marked-not-published"

// publishLate answers every batch at once as acknowledged and sends it
// later: with the next batch, or after a quiet moment. The relay, told the
// batch is stored, marks it published and commits; the bug of a relay that
// marks before JetStream acknowledged. A process that dies in between
// leaves rows marked published that the stream never held. A send that
// fails is tried again with the next batch, in order: only a death loses.
type publishLate struct {
	pub broker.Publisher

	mu      sync.Mutex
	pending []broker.Message
	since   time.Time
}

func (p *publishLate) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	res := make([]broker.Result, len(msgs))
	p.mu.Lock()
	defer p.mu.Unlock()
	err := p.sendPending(ctx)
	for i, m := range msgs {
		res[i] = broker.Result{ID: m.ID, Err: err}
	}
	if err == nil {
		for _, m := range msgs { // the relay may reuse its buffers
			m.Payload, m.Headers = slices.Clone(m.Payload), maps.Clone(m.Headers)
			p.pending = append(p.pending, m)
		}
		p.since = time.Now()
	}
	return res
}

// run sends what waited more than quiet, until ctx ends.
func (p *publishLate) run(ctx context.Context, quiet time.Duration) {
	t := time.NewTicker(quiet)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.mu.Lock()
		if time.Since(p.since) >= quiet {
			_ = p.sendPending(ctx)
		}
		p.mu.Unlock()
	}
}

// sendPending publishes what the relay already took for acknowledged.
func (p *publishLate) sendPending(ctx context.Context) error {
	if len(p.pending) == 0 {
		return nil
	}
	crashAt(crashMarkedNotPublished)
	for _, r := range p.pub.Publish(ctx, p.pending) {
		if r.Err != nil {
			return r.Err // all again next time: the broker drops the copies
		}
	}
	p.pending = p.pending[:0]
	return nil
}
