package untrusted

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Storable reports whether s can be stored in a text column as it is: valid
// UTF-8 without a NUL byte.
func Storable(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// replacement stands for each byte of s that cannot be stored.
const replacement = "\uFFFD"

// ellipsis ends a value Text cut short.
const ellipsis = "…"

// Text returns s made storable: each invalid UTF-8 byte and each NUL becomes
// U+FFFD, and a result longer than maxBytes is cut on a character boundary
// and ends with "…", within maxBytes. A storable s no longer than maxBytes is
// returned as it is. maxBytes below 8 is taken as 8.
func Text(s string, maxBytes int) string {
	maxBytes = max(maxBytes, 8)
	s = clean(s)
	if len(s) <= maxBytes {
		return s
	}
	cut := maxBytes - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}

// clean replaces each invalid UTF-8 byte and each NUL of s with U+FFFD.
func clean(s string) string {
	if Storable(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size <= 1) || r == 0 {
			b.WriteString(replacement)
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// hashLen is the length of the suffix Key appends: a separator and 32 hex
// digits (128 bits of SHA-256).
const hashLen = 1 + 32

// keySeparator starts the suffix of a Key that is not its input.
const keySeparator = "~"

// Key returns s as a storable identifier of at most maxBytes bytes that no
// other input maps to: s itself when it is storable, fits, and does not end
// the way a derived key ends; otherwise Text(s) cut to leave room for "~"
// and 32 hex digits of s's SHA-256. Two different inputs give two different
// keys (up to a SHA-256 collision), so a unique index on keys is as exact as
// one on the raw values would be. maxBytes below 64 is taken as 64.
func Key(s string, maxBytes int) string {
	maxBytes = max(maxBytes, 64)
	if len(s) <= maxBytes && Storable(s) && !derived(s) {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return Text(s, maxBytes-hashLen) + keySeparator + hex.EncodeToString(sum[:16])
}

// derived reports whether s ends the way a key Key derived ends.
func derived(s string) bool {
	if len(s) < hashLen || s[len(s)-hashLen:len(s)-hashLen+1] != keySeparator {
		return false
	}
	for _, c := range s[len(s)-hashLen+1:] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// Headers returns h with every name and value storable in a jsonb object:
// each value made readable with every byte kept (Text), each name made a
// Key, so that two names never merge. It also reports whether that is h
// itself, every name and value storable as it is.
func Headers(h map[string][]string) (map[string][]string, bool) {
	exact := true
	for name, vs := range h {
		exact = exact && Storable(name)
		for _, v := range vs {
			exact = exact && Storable(v)
		}
	}
	if exact {
		return h, true
	}
	out := make(map[string][]string, len(h))
	for name, vs := range h {
		clean := make([]string, len(vs))
		for i, v := range vs {
			clean[i] = Text(v, len(v)*3+8) // every byte kept, made readable
		}
		out[Key(name, len(name)*3+64)] = clean
	}
	return out, false
}

// Printable returns s safe to print on a terminal: every control character
// (tab and newline included, and the C1 controls that start escape
// sequences) and every invalid UTF-8 byte is written as a Go escape (\t,
// \x1b, \u009b), and a backslash as \\. What a broker, a provider or a
// client sent then reaches an operator's terminal as text, never as a
// command to it.
func Printable(s string) string {
	return printable(s, false)
}

// PrintableText is Printable for text of several lines: newlines and tabs
// are kept.
func PrintableText(s string) string {
	return printable(s, true)
}

func printable(s string, lines bool) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f || c == '\\' || c >= utf8.RuneSelf {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case lines && (r == '\n' || r == '\t'):
			b.WriteRune(r)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case !unicode.IsPrint(r) && !unicode.IsSpace(r) || (r >= 0x80 && r < 0xa0):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}
