package main

import "strings"

// oneLine folds whitespace (newlines included) and cuts s to at most n
// runes, for error texts in tables.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
