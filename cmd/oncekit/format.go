package main

import (
	"strings"

	"github.com/oncekit/oncekit/cmd/oncekit/internal/printable"
)

// oneLine folds whitespace (newlines included), cuts s to at most n runes
// and escapes what a terminal would take for a command (cell), for error
// texts in tables.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		s = string(r[:n-1]) + "…"
	}
	return cell(s)
}

// cell is a value from outside (a message ID, a subject, a header, a
// provider's text) as a table or a listing prints it: control characters
// and invalid UTF-8 escaped, so that none reaches the operator's terminal.
// --json escapes them as JSON does.
func cell(s string) string { return printable.String(s) }
