// Package cfgerr builds the errors constructors return for a bad Config
// field: "pkg: Config.Field: detail", wrapping the package's ErrInvalidConfig
// sentinel and the cause, if any, so that errors.Is works on both.
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

// For returns New bound to sentinel and to config, a config type's name
// written "pkg: Config": the func a validate method calls with a field's
// name ("Schema") for each bad field.
func For(sentinel error, config string) func(field, format string, args ...any) error {
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
