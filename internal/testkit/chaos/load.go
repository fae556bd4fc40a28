package chaos

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncekit/oncekit/internal/wait"
	"github.com/oncekit/oncekit/sideeffect/webhook"
)

// Load sends payments to the API processes: each operation under a fresh
// key, with short client timeouts, retried with the same key and body while
// the outcome is unknown; a share of requests reusing the key of an
// acknowledged payment with a different body; and a share sending an
// acknowledged payment again (its reference and body) under a new key.
type Load struct {
	// APIs are the base URLs of the API processes; retries move between them.
	APIs []string
	// Workers send operations concurrently. Defaults to 6.
	Workers int
	// Accounts spreads payments over this many accounts (ordering keys).
	// Defaults to 16.
	Accounts int
	// ReuseShare is the share of operations that reuse a key with another
	// body. Defaults to 0.05.
	ReuseShare float64
	// RekeyShare is the share of operations that send an acknowledged
	// payment again under a new key. Defaults to 0.03.
	RekeyShare float64
	// MaxAttempts bounds the tries per operation. Defaults to 8.
	MaxAttempts int
	// MaxOps bounds the operations over the whole run. Defaults to 100,000.
	MaxOps int
	// Rate paces the operations started per second, over all workers, so
	// that a long run spreads its MaxOps over its whole duration. Zero: as
	// fast as the workers go.
	Rate float64
	// Seed makes the choices repeatable.
	Seed uint64
	// History receives every operation.
	History *History
}

// Run sends operations until ctx ends or MaxOps is reached.
func (l *Load) Run(ctx context.Context) {
	workers := cmp.Or(l.Workers, 6)
	var ops sync.WaitGroup
	var n atomic.Int64
	var tick <-chan time.Time
	if l.Rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / l.Rate))
		defer t.Stop()
		tick = t.C
	}
	for w := range workers {
		ops.Go(func() {
			rng := rand.New(rand.NewPCG(l.Seed, uint64(w)))
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
			for i := 0; ctx.Err() == nil && n.Add(1) <= int64(cmp.Or(l.MaxOps, 100_000)); i++ {
				if tick != nil {
					select {
					case <-tick:
					case <-ctx.Done():
						return
					}
				}
				op := l.nextOp(rng, w, i)
				l.History.Add(l.execute(ctx, client, rng, op))
			}
		})
	}
	ops.Wait()
}

func (l *Load) nextOp(rng *rand.Rand, worker, i int) Op {
	key := fmt.Sprintf("pay-%d-%d-%d", l.Seed, worker, i)
	switch r := rng.Float64(); {
	case r < cmp.Or(l.ReuseShare, 0.05):
		if prev, ok := l.History.acked(rng.IntN); ok {
			return Op{Key: prev.Key, Account: prev.Account, Amount: prev.Amount + 1 + rng.Int64N(100), Reference: prev.Reference, Reuse: true}
		}
	case r < cmp.Or(l.ReuseShare, 0.05)+cmp.Or(l.RekeyShare, 0.03):
		if prev, ok := l.History.acked(rng.IntN); ok {
			return Op{Key: key, Account: prev.Account, Amount: prev.Amount, Reference: prev.Reference, RekeyOf: prev.Key}
		}
	}
	return Op{
		Key:       key,
		Account:   fmt.Sprintf("acct-%02d", rng.IntN(cmp.Or(l.Accounts, 16))),
		Amount:    1 + rng.Int64N(100_000),
		Reference: "ref-" + key,
	}
}

// execute retries op with the same key and body until a definite answer.
func (l *Load) execute(ctx context.Context, client *http.Client, rng *rand.Rand, op Op) Op {
	op.Start = time.Now()
	op.Outcome = Unknown
	body := fmt.Appendf(nil, `{"account":%q,"amount":%d,"currency":"EUR","reference":%q}`, op.Account, op.Amount, op.Reference)
	api := rng.IntN(len(l.APIs))
	for op.Attempts < cmp.Or(l.MaxAttempts, 8) && ctx.Err() == nil {
		op.Attempts++
		// Short client timeouts: some answers arrive after the client gave
		// up, which is the case retries with the same key exist for.
		timeout := time.Duration(150+rng.IntN(1500)) * time.Millisecond
		status, err := post(ctx, client, l.APIs[api%len(l.APIs)]+"/payments", op.Key, body, timeout)
		op.Status = status
		switch {
		case err == nil && status >= 200 && status < 300:
			op.Outcome = OK
		case err == nil && status >= 400 && status < 500 && !webhook.Retryable(status): // a 4xx but "not now" is final
			op.Outcome = Failed
		}
		if op.Outcome != Unknown {
			break
		}
		api++ // the next attempt goes to another API process
		wait.Sleep(ctx, time.Duration(50+rng.IntN(250))*time.Millisecond)
	}
	op.End = time.Now()
	return op
}
