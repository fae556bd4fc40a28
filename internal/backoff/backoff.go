package backoff

import (
	"context"
	"math/rand/v2"
	"time"

	cenkalti "github.com/cenkalti/backoff/v4"
)

// Policy is an exponential backoff: Min after the first failure, doubling
// with each consecutive one, at most Max, each wait spread by Jitter. The
// zero value waits nothing.
type Policy struct {
	// Min is the wait after the first failure. A negative Min is 0.
	Min time.Duration
	// Max is the longest wait; below Min it is Min.
	Max time.Duration
	// Jitter is the randomization factor: a wait d is drawn uniformly from
	// [d×(1−Jitter), d×(1+Jitter)] and then kept within [Min, Max], so
	// that failures at the same moment do not retry together (0.2: ±20 %).
	// 0 waits exactly d.
	Jitter float64
	// FullJitter draws a wait d uniformly from [0, d] instead ("full
	// jitter"), for clients many of which fail at once. Jitter is then
	// unused, and Min is not a lower bound.
	FullJitter bool
}

// bounds returns Min and Max made consistent: 0 <= lo <= hi.
func (p Policy) bounds() (lo, hi time.Duration) {
	lo = max(p.Min, 0)
	return lo, max(p.Max, lo)
}

// exponential is cenkalti's ExponentialBackOff for p's growth, without its
// randomization (spread applies p's, kept within bounds) and without an
// elapsed-time limit (a daemon retries for as long as it runs).
func (p Policy) exponential() *cenkalti.ExponentialBackOff {
	lo, hi := p.bounds()
	b := &cenkalti.ExponentialBackOff{
		InitialInterval: lo,
		Multiplier:      2,
		MaxInterval:     hi,
		MaxElapsedTime:  0,
		Stop:            cenkalti.Stop,
		Clock:           cenkalti.SystemClock,
	}
	b.Reset()
	return b
}

// spread applies p's jitter to the un-jittered wait d.
func (p Policy) spread(d time.Duration) time.Duration {
	lo, hi := p.bounds()
	switch {
	case p.FullJitter:
		return time.Duration(rand.Int64N(int64(d) + 1))
	case p.Jitter > 0:
		j := float64(d) * (1 + p.Jitter*(2*rand.Float64()-1))
		return min(max(time.Duration(j), lo), hi)
	default:
		return d
	}
}

// Delay is the wait after the attempt-th consecutive failure (attempt 1 is
// the first, and anything below 1 counts as 1): Min doubled attempt−1
// times, at most Max, spread by Jitter. It is for failures counted
// elsewhere, such as a row's stored attempts.
func (p Policy) Delay(attempt int) time.Duration {
	_, hi := p.bounds()
	b := p.exponential()
	d := b.NextBackOff()
	for i := 1; i < attempt && d > 0 && d < hi; i++ {
		d = b.NextBackOff()
	}
	return p.spread(d)
}

// Start returns a Backoff at its first wait.
func (p Policy) Start() *Backoff {
	return &Backoff{p: p, b: p.exponential()}
}

// Backoff is the state of one run of failures under a Policy: each Next
// is the wait after one more failure, and Reset starts over. It is not
// safe for concurrent use.
type Backoff struct {
	p Policy
	b *cenkalti.ExponentialBackOff
}

// Next returns the wait after one more consecutive failure: the first
// call Min, then doubling up to Max, each spread by the Policy's jitter.
func (b *Backoff) Next() time.Duration { return b.p.spread(b.b.NextBackOff()) }

// Reset starts over after a success: the next wait is Min again.
func (b *Backoff) Reset() { b.b.Reset() }

// NextBackOff implements cenkalti's BackOff.
func (b *Backoff) NextBackOff() time.Duration { return b.Next() }

var _ cenkalti.BackOff = (*Backoff)(nil)

// Retry calls op until it returns nil, it returns an error marked by
// Permanent, or ctx ends, waiting p's growing delays between failures.
// notify, if not nil, is told each failure and the wait that follows it
// (to log it). Retry returns nil, the permanent error (unwrapped), or ctx's
// error; op is not called once ctx has ended.
func Retry(ctx context.Context, p Policy, op func(ctx context.Context) error, notify func(err error, wait time.Duration)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return cenkalti.RetryNotify(func() error { return op(ctx) }, cenkalti.WithContext(p.Start(), ctx), notify)
}

// Permanent marks err as one Retry does not retry: Retry returns err.
func Permanent(err error) error { return cenkalti.Permanent(err) }
