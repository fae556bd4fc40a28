package oncekit

import (
	"errors"
	"fmt"
	"regexp"
)

// ErrInvalidSchema is wrapped by the error of every constructor, and of
// ValidateSchema, given a schema name that is not a plain lower-case SQL
// identifier.
var ErrInvalidSchema = errors.New("oncekit: invalid schema name")

var schemaRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidateSchema returns the schema name every Config's Schema field takes
// name to: DefaultSchema for "", name itself for a plain lower-case
// identifier (letters, digits, underscore; at most 63 bytes), so that a
// schema name taken from configuration can never carry SQL; any other name
// is refused with an error wrapping ErrInvalidSchema. A command line or a
// service's own configuration can check a name with it before it connects.
func ValidateSchema(name string) (string, error) {
	if name == "" {
		return DefaultSchema, nil
	}
	if !schemaRe.MatchString(name) {
		return "", fmt.Errorf("%w: %q (want [a-z_][a-z0-9_]*, at most 63 bytes)", ErrInvalidSchema, name)
	}
	return name, nil
}
