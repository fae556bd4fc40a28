package idempotency

import "github.com/prometheus/client_golang/prometheus"

// The kinds of weak key counted in oncekit_idempotency_key_quality_total.
// A key is of one kind at most, the first that fits in this order.
const (
	keyKindEmail     = "email"     // holds an e-mail address: personal data, stored only as a digest but sent everywhere
	keyKindTimestamp = "timestamp" // holds a Unix time (s or ms) or a calendar date: two intents in one tick collide
	keyKindCounter   = "counter"   // a number, or a word and a number ("order-42"): guessable, reset by a reinstall
	keyKindShort     = "short"     // fewer than minGoodKeyLen bytes: too little room for randomness
)

// minGoodKeyLen is the length under which a key is counted short: a
// 96-bit random value in base64 takes 16 bytes, a UUID 36.
const minGoodKeyLen = 16

// newKeyQuality returns the counter of weak keys, by operation and kind.
func newKeyQuality() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "oncekit", Subsystem: "idempotency",
		Name: "key_quality_total",
		Help: "New requests whose Idempotency-Key looks weak, by operation and kind (email, timestamp, counter, short); such keys are accepted."},
		[]string{"operation", "kind"})
}

// countNew counts a request whose handler runs under a newly claimed key
// (outcome new), and its key's kind when it looks weak.
func (rt *route) countNew(id recordID) {
	rt.count(OutcomeNew)
	if kind := keyKind(id.key); kind != "" {
		rt.e.m.keyQuality.WithLabelValues(id.operation, kind).Inc()
	}
}

// keyKind returns the kind of weak key key looks like, or "" for a key
// that looks random and opaque. It is a heuristic over at most MaxKeyLen
// bytes, with no allocation: a random key is very rarely taken for a weak
// one (a run of 10 or 13 digits standing alone as a word, or a
// letters-only prefix before a short number), and a weak key may pass
// (a timestamp in hex).
func keyKind(key string) string {
	if isEmailLike(key) {
		return keyKindEmail
	}
	if hasTimestamp(key) {
		return keyKindTimestamp
	}
	if isCounter(key) {
		return keyKindCounter
	}
	if len(key) < minGoodKeyLen {
		return keyKindShort
	}
	return ""
}

func isDigit(c byte) bool  { return c >= '0' && c <= '9' }
func isLetter(c byte) bool { return (c|0x20) >= 'a' && (c|0x20) <= 'z' }
func isAlnum(c byte) bool  { return isDigit(c) || isLetter(c) }

// isEmailLike reports whether key holds local@domain.tld: letters or
// digits on both sides of an "@", and a "." within the domain.
func isEmailLike(key string) bool {
	for i := 1; i < len(key)-1; i++ {
		if key[i] != '@' || !isAlnum(key[i-1]) || !isAlnum(key[i+1]) {
			continue
		}
		for j := i + 2; j < len(key)-1 && key[j] != '@'; j++ {
			if key[j] == '.' && isAlnum(key[j-1]) && isAlnum(key[j+1]) {
				return true
			}
		}
	}
	return false
}

// hasTimestamp reports whether key holds, as a word of its own (bounded by
// the key's ends or by characters other than letters and digits), a Unix
// time in seconds or milliseconds from 2001 to 2039, or a calendar date
// written YYYY-MM-DD (years 1970 to 2099). A date written YYYYMMDD is not
// looked for: a UUID's first group is eight digits one time in 43, and
// one in 2,000 of those reads as a date.
func hasTimestamp(key string) bool {
	for i := 0; i < len(key); {
		if !isAlnum(key[i]) {
			i++
			continue
		}
		j := i
		for j < len(key) && isAlnum(key[j]) {
			j++
		}
		if word := key[i:j]; allDigits(word) {
			switch len(word) {
			case 10:
				if word >= "1000000000" && word < "2200000000" {
					return true
				}
			case 13:
				if word >= "1000000000000" && word < "2200000000000" {
					return true
				}
			case 4:
				if j+6 <= len(key) && key[j] == '-' && key[j+3] == '-' &&
					isDate(word, key[j+1:j+3], key[j+4:j+6]) && (j+6 == len(key) || !isDigit(key[j+6])) {
					return true
				}
			}
		}
		i = j
	}
	return false
}

// isDate reports whether the digits y, m and d are a plausible date.
func isDate(y, m, d string) bool {
	return allDigits(y) && allDigits(m) && allDigits(d) &&
		y >= "1970" && y <= "2099" && m >= "01" && m <= "12" && d >= "01" && d <= "31"
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return s != ""
}

// isCounter reports whether key is a number of at most nine digits, or
// letters and separators ending in a separator followed by one
// ("order-42", "req_000123").
func isCounter(key string) bool {
	i := len(key)
	for i > 0 && isDigit(key[i-1]) {
		i--
	}
	if n := len(key) - i; n == 0 || n > 9 {
		return false
	}
	if i > 0 && isAlnum(key[i-1]) {
		return false // "abc42": no separator before the number
	}
	for k := 0; k < i; k++ {
		if isDigit(key[k]) {
			return false
		}
	}
	return true
}
