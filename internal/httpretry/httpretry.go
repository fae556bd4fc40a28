// Package httpretry holds what every oncekit HTTP client decides the same
// way: which answers are worth another attempt, and how long Retry-After
// asks to wait.
package httpretry

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Retryable reports whether a non-2xx status is indefinite: 408, 409, 425,
// 429 and every 5xx. Every other status is definite.
func Retryable(code int) bool {
	switch code {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return true
	}
	return code >= 500
}

// After reads a Retry-After value: delay seconds or an HTTP date (a date in
// the past means zero).
func After(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		return time.Duration(min(secs, int64(365*24*3600))) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}
