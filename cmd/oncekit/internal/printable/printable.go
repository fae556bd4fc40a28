// Package printable escapes what a terminal would take for a command in
// text from outside (a message's payload, subject or headers, a provider's
// answer, an error's text) before the command prints it.
//
// It is the command's own copy of what the library escapes in what it prints:
// an internal package of the library is no API, and a later version of
// the library, which a build may select under this command, may change
// it. FuzzAgreesWithLibrary holds the two to the same output.
package printable

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// String returns s safe to print on a terminal: every control character
// (tab and newline included, and the C1 controls that start escape
// sequences) and every invalid UTF-8 byte is written as a Go escape (\t,
// \x1b, \u009b), and a backslash as \\. What a broker, a provider or a
// client sent then reaches an operator's terminal as text, never as a
// command to it.
func String(s string) string {
	return printable(s, false)
}

// Text is String for text of several lines: newlines and tabs
// are kept.
func Text(s string) string {
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
