package main

import (
	"log/slog"
	"regexp"
)

var (
	urlPassword = regexp.MustCompile(`(://[^:/@\s]*):[^@\s]*@`)
	kvPassword  = regexp.MustCompile(`(?i)(password\s*=\s*)('[^']*'|[^\s&]+)`)
)

// redact hides the passwords of the URLs and keyword/value connection
// strings in s. Every error, log line and help text of the command goes
// through it.
func redact(s string) string {
	s = urlPassword.ReplaceAllString(s, "${1}:xxxxx@")
	return kvPassword.ReplaceAllString(s, "${1}xxxxx")
}

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
