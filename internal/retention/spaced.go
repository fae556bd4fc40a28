package retention

import (
	"cmp"
	"context"
	"sync"
	"time"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/pghook"
	"github.com/oncekit/oncekit/internal/wait"
)

// The retention defaults, oncekit's (stated there once).
const (
	DefaultRate              = oncekit.DefaultRetentionRate
	DefaultRetentionInterval = oncekit.DefaultRetentionInterval
	DefaultBatch             = oncekit.DefaultRetentionBatch
)

// Defaults sets a Config's retention loop settings, given as
// pointers to its RetentionInterval, RetentionBatch and RetentionRate
// fields, to their defaults where they are zero: DefaultRetentionInterval,
// DefaultBatch and DefaultRate.
func Defaults(interval *time.Duration, batch, rate *int) {
	*interval = cmp.Or(*interval, DefaultRetentionInterval)
	*batch = cmp.Or(*batch, DefaultBatch)
	*rate = cmp.Or(*rate, DefaultRate)
}

// Spacing is the least time between two statements of a retention
// pass that deletes batch rows per statement and at most rate rows per
// second: 0 (no pause) when rate is negative.
func Spacing(rate, batch int) time.Duration {
	if rate < 0 {
		return 0
	}
	return time.Duration(float64(batch) / float64(max(rate, 1)) * float64(time.Second))
}

// Spaced returns q, with each statement started no sooner than every after
// the previous one started: a retention pass run through it deletes its
// backlog at a bounded rate, leaving the database's CPU and I/O to the hot
// paths. A statement waits for its turn or until its ctx ends (its error is
// then ctx's). With every 0, q is returned as it is.
func Spaced(q oncekit.Querier, every time.Duration) oncekit.Querier {
	if every <= 0 {
		return q
	}
	s := &spacer{every: every}
	return pghook.Hooked{Q: q, Before: s.turn}
}

// spacer hands out the turns of Spaced's statements.
type spacer struct {
	every time.Duration

	mu   sync.Mutex
	next time.Time // when the next statement may start
}

// turn waits for the next statement's turn.
func (s *spacer) turn(ctx context.Context) error {
	s.mu.Lock()
	now := time.Now()
	at := s.next
	if at.Before(now) {
		at = now
	}
	s.next = at.Add(s.every)
	s.mu.Unlock()
	if d := at.Sub(now); d > 0 && !wait.Sleep(ctx, d) {
		return ctx.Err()
	}
	return ctx.Err()
}
