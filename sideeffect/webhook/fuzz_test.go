package webhook_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/oncekit/oncekit/sideeffect/webhook"
)

// Retry-After comes from the network: any value parses without panicking to
// a delay that is never negative and never absurd.
func FuzzParseRetryAfter(f *testing.F) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, s := range []string{"", "0", "120", "-5", "1e3", "99999999999999999999", " 7 ",
		now.Add(time.Minute).Format(http.TimeFormat), "Sun, 06 Nov 1994 08:49:37 GMT", "soon"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := webhook.ParseRetryAfter(v, now)
		if !ok && d != 0 {
			t.Fatalf("%q: not ok but %s", v, d)
		}
		if d < 0 {
			t.Fatalf("%q: negative delay %s", v, d)
		}
		if ok && d > 366*24*time.Hour && len(v) < 40 {
			if _, err := http.ParseTime(v); err != nil { // seconds are capped at a year
				t.Fatalf("%q: delay %s over the cap", v, d)
			}
		}
	})
}
