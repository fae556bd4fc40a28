package cfgerr

import (
	"fmt"
	"reflect"
)

// IfNegative returns the error for the first of the fields named that is
// negative in config, "-1 is negative" (a duration shows as one: "-1ns is
// negative"), or nil when none is. It is the check of fields where 0 asks for
// the default, so that only a negative value is refused; a field with a
// minimum or a range is checked on its own ("1ms is below 300ms", "4097 not
// in 1..4096").
//
// config is a Config struct or a pointer to one, and each name one of its
// integer fields (int, int64, time.Duration). Naming a field once, rather
// than its name and its value, leaves no way for the two to disagree; a name
// that is not such a field panics, so the first constructor test to run
// finds the mistake.
func (bad Bad) IfNegative(config any, names ...string) error {
	v := reflect.Indirect(reflect.ValueOf(config))
	for _, name := range names {
		f := v.FieldByName(name)
		if !f.IsValid() || !f.CanInt() {
			panic(fmt.Sprintf("cfgerr: %v has no integer field %q", v.Type(), name))
		}
		if f.Int() < 0 {
			return bad(name, "%v is negative", f.Interface())
		}
	}
	return nil
}
