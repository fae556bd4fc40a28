package main

import (
	"log/slog"

	secrets "github.com/oncekit/oncekit/cmd/oncekit/internal/redact"
)

// redact hides the credentials of the URLs (passwords, tokens) and
// keyword/value connection strings in s. Every error, log line and help
// text of the command goes through it.
func redact(s string) string { return secrets.String(s) }

// redactAttr is a slog ReplaceAttr that redacts string and error values.
func redactAttr(_ []string, a slog.Attr) slog.Attr {
	switch a.Value.Kind() {
	case slog.KindString:
		return slog.String(a.Key, redact(a.Value.String()))
	case slog.KindAny:
		if err, ok := a.Value.Any().(error); ok {
			return slog.String(a.Key, redact(err.Error()))
		}
	}
	return a
}
