package idempotency

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// maxLimitedScopes bounds the scopes whose new-key buckets a route keeps;
// past it, the full buckets (the scopes idle long enough to have refilled)
// are forgotten first.
const maxLimitedScopes = 10_000

// keyLimiter holds a token bucket of new keys per scope, in this process:
// with several processes behind a balancer, a scope gets up to the limit
// at each.
type keyLimiter struct {
	perMinute int
	mu        sync.Mutex
	scopes    map[string]*rate.Limiter
}

func newKeyLimiter(perMinute int) *keyLimiter {
	if perMinute <= 0 {
		return nil
	}
	return &keyLimiter{perMinute: perMinute, scopes: map[string]*rate.Limiter{}}
}

// allow takes a new key from tenant's bucket; false means the scope is over
// its limit, and after says when a token is back.
func (l *keyLimiter) allow(tenant string, now time.Time) (ok bool, after time.Duration) {
	if l == nil {
		return true, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	lim := l.scopes[tenant]
	if lim == nil {
		if len(l.scopes) >= maxLimitedScopes {
			for s, b := range l.scopes {
				if b.TokensAt(now) >= float64(b.Burst()) {
					delete(l.scopes, s)
				}
			}
		}
		lim = rate.NewLimiter(rate.Limit(float64(l.perMinute)/60), l.perMinute)
		l.scopes[tenant] = lim
	}
	if lim.AllowN(now, 1) {
		return true, 0
	}
	return false, time.Duration(float64(time.Second) * (1 - lim.TokensAt(now)) / float64(lim.Limit()))
}
