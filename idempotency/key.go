package idempotency

import (
	"errors"
	"fmt"
	"strings"
)

// HeaderKey is the request header carrying the client's idempotency key.
const HeaderKey = "Idempotency-Key"

// HeaderReplayed is set to "true" on every replayed response.
const HeaderReplayed = "Idempotent-Replayed"

// MaxKeyLen is the longest key accepted, in bytes (after unquoting).
const MaxKeyLen = 255

// ErrInvalidKey is returned by ParseKey for a malformed Idempotency-Key value.
var ErrInvalidKey = errors.New("idempotency: invalid Idempotency-Key")

// ParseKey parses an Idempotency-Key header field value as the IETF httpapi
// draft defines it: a Structured Field sf-string ("..." with only \" and \\
// escapes, printable ASCII inside). A bare token of token characters (as
// many clients send a plain UUID) is accepted too. Surrounding spaces and tabs
// are ignored. The key must be 1 to MaxKeyLen bytes of printable ASCII;
// parameters, lists and anything else are rejected with ErrInvalidKey.
func ParseKey(v string) (string, error) {
	v = strings.Trim(v, " \t")
	if v == "" {
		return "", fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	var key string
	if v[0] == '"' {
		var b strings.Builder
		i := 1
		closed := false
		for i < len(v) {
			c := v[i]
			switch {
			case c == '\\':
				if i+1 >= len(v) || (v[i+1] != '"' && v[i+1] != '\\') {
					return "", fmt.Errorf("%w: bad escape", ErrInvalidKey)
				}
				b.WriteByte(v[i+1])
				i += 2
				continue
			case c == '"':
				closed = true
			case c < 0x20 || c > 0x7e:
				return "", fmt.Errorf("%w: non-printable character", ErrInvalidKey)
			default:
				b.WriteByte(c)
			}
			i++
			if closed {
				break
			}
			if b.Len() > MaxKeyLen {
				return "", fmt.Errorf("%w: longer than %d bytes", ErrInvalidKey, MaxKeyLen)
			}
		}
		if !closed {
			return "", fmt.Errorf("%w: unterminated string", ErrInvalidKey)
		}
		if i != len(v) {
			return "", fmt.Errorf("%w: trailing characters after string", ErrInvalidKey)
		}
		key = b.String()
	} else {
		for i := 0; i < len(v); i++ {
			if !isTokenChar(v[i]) {
				if v[i] < 0x20 || v[i] > 0x7e {
					return "", fmt.Errorf("%w: non-printable character", ErrInvalidKey)
				}
				return "", fmt.Errorf("%w: %q is not allowed in an unquoted key", ErrInvalidKey, v[i])
			}
		}
		key = v
	}
	if key == "" || strings.Trim(key, " ") == "" {
		return "", fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	if len(key) > MaxKeyLen {
		return "", fmt.Errorf("%w: longer than %d bytes", ErrInvalidKey, MaxKeyLen)
	}
	return key, nil
}

// isTokenChar reports whether c may appear in a bare key: RFC 9110 tchar
// plus ":" and "/" (as in a Structured Field token).
func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0
}
