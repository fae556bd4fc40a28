package cfgerr

import "time"

// Value is a numeric Config field's name and value, as IfNegative checks it;
// Field makes one.
type Value struct {
	name     string
	value    any // formatted with %v: "-1", "-1ns"
	negative bool
}

// Field returns the Value of the field named name (an int, an int64 or a
// time.Duration).
func Field[T ~int | ~int64](name string, v T) Value {
	return Value{name: name, value: v, negative: v < 0}
}

// IfNegative returns the error for the first of fields that is negative,
// "-1 is negative" (a duration shows as one: "-1ns is negative"), or nil
// when none is. It is the check of fields where 0 asks for the default, so
// that only a negative value is refused; a field with a minimum or a range
// is checked on its own ("1ms is below 300ms", "4097 not in 1..4096").
func (bad Bad) IfNegative(fields ...Value) error {
	for _, f := range fields {
		if f.negative {
			return bad(f.name, "%v is negative", f.value)
		}
	}
	return nil
}

// Retention returns the error for a negative RetentionInterval or
// RetentionBatch, in that order, or nil. RetentionRate is not checked: a
// negative rate means no limit.
func (bad Bad) Retention(interval time.Duration, batch int) error {
	return bad.IfNegative(Field("RetentionInterval", interval), Field("RetentionBatch", batch))
}
