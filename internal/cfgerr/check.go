package cfgerr

import (
	"fmt"
	"reflect"
	"strings"
	"unicode"
	"unicode/utf8"
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

// MaxIDBytes bounds the names a Config gives its process or consumer (a
// relay's or a dispatcher's ID, a consumer's Name), which are stored in
// lease and claim tables and compared on every statement.
const MaxIDBytes = 255

// IfNotID returns the error for the first of the string fields named that
// is not a storable ID: valid UTF-8, no control character (PostgreSQL's
// text refuses NUL, and a log line should not carry the others), at most
// MaxIDBytes. An empty field passes: it asks for the default. As with
// IfNegative, a name that is not a string field panics.
func (bad Bad) IfNotID(config any, names ...string) error {
	v := reflect.Indirect(reflect.ValueOf(config))
	for _, name := range names {
		f := v.FieldByName(name)
		if !f.IsValid() || f.Kind() != reflect.String {
			panic(fmt.Sprintf("cfgerr: %v has no string field %q", v.Type(), name))
		}
		if why := NotID(f.String()); why != "" {
			return bad(name, "%s", why)
		}
	}
	return nil
}

// NotID says why s is not a storable ID (see IfNotID), or "" when it is.
// It is also the check of IDs read from outside, such as a fleet's
// members bucket.
func NotID(s string) string {
	switch {
	case len(s) > MaxIDBytes:
		return fmt.Sprintf("%d bytes, over %d", len(s), MaxIDBytes)
	case !utf8.ValidString(s):
		return "not valid UTF-8"
	case strings.ContainsFunc(s, unicode.IsControl):
		return fmt.Sprintf("%q holds a control character", s)
	}
	return ""
}
