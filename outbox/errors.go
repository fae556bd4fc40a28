package outbox

import (
	"errors"
	"fmt"

	"github.com/google/uuid"
)

// Reasons a message is rejected by Enqueue. An *InvalidMessageError wraps one
// of them, so errors.Is(err, ErrNilID) and the like work on Enqueue's error.
var (
	// ErrNilID: the message has no ID (uuid.Nil).
	ErrNilID = errors.New("outbox: message ID is nil")
	// ErrInvalidSubject: the subject is empty, has an empty token, a wildcard
	// token, whitespace or a control character, or is longer than 255 bytes.
	ErrInvalidSubject = errors.New("outbox: invalid subject")
	// ErrPayloadTooLarge: the payload is over Config.MaxPayload.
	ErrPayloadTooLarge = errors.New("outbox: payload too large")
	// ErrInvalidHeader: a header name is empty, not an HTTP token, or one that
	// oncekit sets itself; or a header value holds CR, LF or NUL.
	ErrInvalidHeader = errors.New("outbox: invalid header")
	// ErrInvalidKey: the ordering key is longer than 1024 bytes or holds CR,
	// LF or NUL (it travels in a header).
	ErrInvalidKey = errors.New("outbox: invalid ordering key")
)

// InvalidMessageError reports the first invalid message of an Enqueue call.
// Nothing of that call was written.
type InvalidMessageError struct {
	// Index is the message's position in the Enqueue call.
	Index int
	// ID is the message's ID (possibly uuid.Nil).
	ID uuid.UUID
	// Err is the reason: one of the Err* sentinels.
	Err error
	// Detail says what exactly is wrong.
	Detail string
}

// Error implements error.
func (e *InvalidMessageError) Error() string {
	return fmt.Sprintf("%v: message %d (%s): %s", e.Err, e.Index, e.ID, e.Detail)
}

// Unwrap returns the sentinel reason.
func (e *InvalidMessageError) Unwrap() error { return e.Err }
