package outbox

import (
	"context"
	"time"

	"github.com/oncekit/oncekit/broker"
)

// The publishing stage both relays share: the polling relay feeds it rows
// read from the table, the logical relay events decoded from the WAL. It
// sends a key's message only once the key's previous one was acknowledged,
// and classifies every result.

// outcome is what became of one message of a round.
type outcome uint8

const (
	notSent outcome = iota // not attempted: behind its key's failure, or the round was cut short
	acked                  // the broker acknowledged it
	failed                 // the broker refused it: an attempt is counted
)

// keyedPublisher publishes rounds of messages in key order.
type keyedPublisher struct {
	pub broker.Publisher
	// timeout bounds each publish call; it is asked before each.
	timeout func() time.Duration
	// live reports whether sending may go on (nil: always). Asked before
	// each wave and after a chained round: once false, nothing more is
	// sent, and what was not acknowledged is notSent, not failed (the cut
	// is not the messages' fault).
	live func() bool
}

// round is what became of one publishing round.
type round struct {
	outcome []outcome
	errs    []error // of the failed messages
	waves   int     // publish calls made
	cut     bool    // live turned false while publishing
	// down reports a round in which nothing was acknowledged and something
	// failed while the broker is unreachable: the failures are the
	// broker's, not the messages'.
	down bool
}

func (r *round) set(j int, o outcome, err error) { r.outcome[j], r.errs[j] = o, err }

// publish sends msgs, in commit order, in one round: chained per key
// through a ChainPublisher, else in waves holding at most one message per
// key, a key's next sent in the next wave and never after its key failed.
func (kp keyedPublisher) publish(ctx context.Context, msgs []broker.Message) *round {
	r := &round{outcome: make([]outcome, len(msgs)), errs: make([]error, len(msgs))}
	if cp, ok := kp.pub.(broker.ChainPublisher); ok {
		kp.chained(ctx, cp, msgs, r)
	} else {
		kp.inWaves(ctx, msgs, r)
	}
	r.down = r.nothingAcked() && brokerDown(kp.pub)
	return r
}

func (kp keyedPublisher) chained(ctx context.Context, cp broker.ChainPublisher, msgs []broker.Message, r *round) {
	prev := make([]int, len(msgs))
	last := make(map[string]int, len(msgs))
	for j := range msgs {
		prev[j] = -1
		if k := msgs[j].Key; k != "" {
			if p, ok := last[k]; ok {
				prev[j] = p
			}
			last[k] = j
		}
	}
	pctx, cancel := context.WithTimeout(ctx, kp.timeout())
	results := cp.PublishChain(pctx, msgs, prev)
	cancel()
	r.waves = 1
	r.cut = kp.live != nil && !kp.live()
	skipped := make([]bool, len(results))
	for j, res := range results {
		switch {
		case res.Err == nil:
			r.set(j, acked, nil)
		case prev[j] >= 0 && (skipped[prev[j]] || results[prev[j]].Err != nil):
			skipped[j] = true // not attempted: behind its key's failure
		case r.cut:
			skipped[j] = true // cut short: not the message's fault
		default:
			r.set(j, failed, res.Err)
		}
	}
}

func (kp keyedPublisher) inWaves(ctx context.Context, msgs []broker.Message, r *round) {
	blocked := map[string]bool{}
	for _, wave := range waves(msgs) {
		send := make([]int, 0, len(wave))
		for _, j := range wave {
			if k := msgs[j].Key; k == "" || !blocked[k] {
				send = append(send, j)
			}
		}
		if len(send) == 0 {
			continue
		}
		if kp.live != nil && !kp.live() {
			r.cut = true // send nothing more; what was acked stays acked
			return
		}
		r.waves++
		batch := make([]broker.Message, len(send))
		for n, j := range send {
			batch[n] = msgs[j]
		}
		pctx, cancel := context.WithTimeout(ctx, kp.timeout())
		results := kp.pub.Publish(pctx, batch)
		cancel()
		for n, res := range results {
			j := send[n]
			if res.Err == nil {
				r.set(j, acked, nil)
				continue
			}
			r.set(j, failed, res.Err)
			if k := msgs[j].Key; k != "" {
				blocked[k] = true // the rest of this key waits for the retry
			}
		}
		if r.nothingAcked() && brokerDown(kp.pub) {
			return // the broker is down: no more waves
		}
	}
}

// nothingAcked reports that no message was acknowledged and some failed.
func (r *round) nothingAcked() bool {
	nfailed := 0
	for _, o := range r.outcome {
		switch o {
		case acked:
			return false
		case failed:
			nfailed++
		}
	}
	return nfailed > 0
}

// brokerDown reports a publisher that knows it is disconnected.
func brokerDown(pub broker.Publisher) bool {
	cp, ok := pub.(broker.ConnectedPublisher)
	return ok && !cp.Connected()
}

// waves splits msgs (in commit order) into publish rounds holding at most
// one message per ordering key, so that a key's next message is sent only
// after the previous one was acknowledged; it returns indexes into msgs.
// Messages without a key all go in the first round.
func waves(msgs []broker.Message) [][]int {
	var out [][]int
	depth := map[string]int{}
	for j := range msgs {
		k, d := msgs[j].Key, 0
		if k != "" {
			d = depth[k]
			depth[k] = d + 1
		}
		if d == len(out) {
			out = append(out, nil)
		}
		out[d] = append(out[d], j)
	}
	return out
}
