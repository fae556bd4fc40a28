// Package cfgerr is the vocabulary oncekit's Configs share: the errors
// constructors return for a bad Config field ("pkg: Config.Field: detail",
// wrapping the package's ErrInvalidConfig sentinel and the cause, if any, so
// that errors.Is works on both) and the check every Config makes of its
// numeric fields (IfNegative). It depends on no other oncekit package, so
// the broker adapters may use it too.
//
// A Config's withDefaults starts from CopyOf(c) and fills in its defaults;
// its validate binds Bad to the package's sentinel with For, states its
// non-negative fields once with IfNegative (a retention loop's
// RetentionInterval and RetentionBatch among them; their defaults are
// retention.Defaults's), then checks what is particular to it (ranges,
// minimums, one field against another). The same failure is worded the same
// everywhere: "-1 is negative" for a negative field, "1ms is below 300ms"
// for a value under its minimum, "1s is below MinBackoff (1m0s)" for one
// field under another, "required" for a missing one.
package cfgerr

import (
	"fmt"
	"strings"
)

// Error is a bad Config field.
type Error struct {
	field    string // "pkg: Config.Field"
	sentinel error
	detail   error
}

// New returns the error for field (written "pkg: Config.Field") wrapping
// sentinel; format and args describe what is wrong, and a %w among them
// wraps a cause too.
func New(sentinel error, field, format string, args ...any) error {
	return &Error{field: field, sentinel: sentinel, detail: fmt.Errorf(format, args...)}
}

// Bad is New bound by For to a sentinel and a config type: it returns the
// error for that type's field named by field alone ("Schema").
type Bad func(field, format string, args ...any) error

// For returns New bound to sentinel and to config, a config type's name
// written "pkg: Config": the Bad a validate method calls with a field's
// name ("Schema") for each bad field.
func For(sentinel error, config string) Bad {
	return func(field, format string, args ...any) error {
		return New(sentinel, config+"."+field, format, args...)
	}
}

// Error returns "pkg: Config.Field: detail". A detail that starts with the
// package's own prefix (a wrapped package error) loses it, so the prefix
// shows once.
func (e *Error) Error() string {
	detail := e.detail.Error()
	if pkg, _, ok := strings.Cut(e.field, ": "); ok {
		detail = strings.TrimPrefix(detail, pkg+": ")
	}
	return e.field + ": " + detail
}

// Unwrap returns the sentinel and the detail (which wraps the cause, if any).
func (e *Error) Unwrap() []error { return []error{e.sentinel, e.detail} }

// CopyOf returns a copy of *c, or the zero T if c is nil: the start of a
// withDefaults, since a nil *Config means the zero Config.
func CopyOf[T any](c *T) T {
	var out T
	if c != nil {
		out = *c
	}
	return out
}
