package outbox

import (
	"fmt"
	"strings"

	"github.com/google/uuid"

	"github.com/oncekit/oncekit/broker"
)

const (
	maxSubjectLen = 255
	maxKeyLen     = 1024
)

// reserved are the headers oncekit sets itself on every published message.
var reserved = map[string]bool{
	strings.ToLower(broker.HeaderMsgID):   true,
	strings.ToLower(broker.HeaderEventID): true,
	strings.ToLower(broker.HeaderKey):     true,
}

// validate checks one message against the rules Enqueue documents.
func validate(i int, m broker.Message, maxPayload int) error {
	bad := func(err error, format string, args ...any) error {
		return &InvalidMessageError{Index: i, ID: m.ID, Err: err, Detail: fmt.Sprintf(format, args...)}
	}
	if m.ID == uuid.Nil {
		return bad(ErrNilID, "set an ID, e.g. oncekit.DeriveID(...)")
	}
	if d := checkSubject(m.Subject); d != "" {
		return bad(ErrInvalidSubject, "%q: %s", m.Subject, d)
	}
	if len(m.Payload) > maxPayload {
		return bad(ErrPayloadTooLarge, "%d bytes, limit %d", len(m.Payload), maxPayload)
	}
	if len(m.Key) > maxKeyLen || strings.ContainsAny(m.Key, "\r\n\x00") {
		return bad(ErrInvalidKey, "at most %d bytes, no CR, LF or NUL", maxKeyLen)
	}
	for k, v := range m.Headers {
		if !isToken(k) {
			return bad(ErrInvalidHeader, "name %q is not a token", k)
		}
		if reserved[strings.ToLower(k)] {
			return bad(ErrInvalidHeader, "name %q is set by oncekit", k)
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			return bad(ErrInvalidHeader, "value of %q holds CR, LF or NUL", k)
		}
	}
	return nil
}

// checkSubject returns why s is not a valid subject to publish on, or "".
func checkSubject(s string) string {
	if s == "" {
		return "empty"
	}
	if len(s) > maxSubjectLen {
		return fmt.Sprintf("longer than %d bytes", maxSubjectLen)
	}
	for _, tok := range strings.Split(s, ".") {
		switch tok {
		case "":
			return "empty token"
		case "*", ">":
			return "wildcard token"
		}
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f {
			return "whitespace or control character"
		}
	}
	return ""
}

// isToken reports whether s is an RFC 9110 token (a valid header name).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
