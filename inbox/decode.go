package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrUndecodable wraps the error of a payload that could not be decoded.
// JSON makes it permanent: such a message is dead-lettered, not retried.
var ErrUndecodable = errors.New("undecodable payload")

// JSON adapts a handler of decoded payloads. A payload that does not decode
// into T is dead-lettered with reason "permanent: undecodable payload: …"
// instead of being redelivered until MaxAttempts.
func JSON[T any](fn func(ctx context.Context, tx pgx.Tx, msg *Message, v T) error) Handler {
	return HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *Message) error {
		var v T
		if err := json.Unmarshal(msg.Payload, &v); err != nil {
			return Permanent(fmt.Errorf("%w: %w", ErrUndecodable, err))
		}
		return fn(ctx, tx, msg, v)
	})
}
