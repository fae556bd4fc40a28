package inbox

import (
	"errors"
	"fmt"
)

// ErrInvalidConfig is returned by NewConsumer for a Config it cannot use;
// the message names the field.
var ErrInvalidConfig = errors.New("inbox: invalid config")

// ErrRetentionTooShort is returned by Run when Config.Retention does not
// exceed the source's redelivery horizon.
var ErrRetentionTooShort = errors.New("inbox: retention shorter than the redelivery horizon")

// ErrTxOwned is returned when a handler tries to commit or roll back the
// transaction the Consumer owns.
var ErrTxOwned = errors.New("inbox: the transaction belongs to the consumer; return an error to roll back")

// ErrPanic wraps a value a handler panicked with.
var ErrPanic = errors.New("inbox: handler panicked")

// PermanentError marks an error that retrying cannot fix: the message goes
// to dead_letters at once.
type PermanentError struct {
	Err error // the cause
}

// Error returns "permanent: " and the wrapped error's text.
func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }

// Unwrap returns the wrapped error.
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err so that the Consumer dead-letters the message instead
// of retrying it. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// IsPermanent reports whether err is or wraps a PermanentError.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

// Dead-letter reasons written to dead_letters.reason for messages the
// handler never saw; handler errors are written as their text.
const (
	ReasonNoID        = "no message id"
	ReasonInvalidID   = "invalid message id"
	reasonMaxAttempts = "max attempts reached: "
	// reasonUnauthenticated starts the reason of a message Config.Verifier
	// refused.
	reasonUnauthenticated = "unauthenticated: "
)

func invalidID(raw string) string { return fmt.Sprintf("%s %q", ReasonInvalidID, raw) }
