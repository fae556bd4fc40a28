package cfgerr

import (
	"errors"
	"testing"
	"time"
)

func TestIfNegative(t *testing.T) {
	t.Parallel()
	sentinel := errors.New("pkg: invalid config")
	bad := For(sentinel, "pkg: Config")
	for _, tc := range []struct {
		fields []Value
		want   string // "" for nil
	}{
		{nil, ""},
		{[]Value{Field("N", 0), Field("D", time.Duration(0)), Field("L", int64(0))}, ""},
		{[]Value{Field("N", 1), Field("D", time.Second)}, ""},
		{[]Value{Field("N", -1)}, "pkg: Config.N: -1 is negative"},
		{[]Value{Field("L", int64(-2))}, "pkg: Config.L: -2 is negative"},
		{[]Value{Field("D", -time.Second)}, "pkg: Config.D: -1s is negative"},
		{[]Value{Field("N", 1), Field("D", time.Duration(-1)), Field("M", -1)}, "pkg: Config.D: -1ns is negative"},
	} {
		err := bad.IfNegative(tc.fields...)
		if got := text(err); got != tc.want {
			t.Fatalf("IfNegative(%+v) = %q, want %q", tc.fields, got, tc.want)
		}
		if err != nil && !errors.Is(err, sentinel) {
			t.Fatalf("%v does not wrap the sentinel", err)
		}
	}
}

func TestRetention(t *testing.T) {
	t.Parallel()
	bad := For(errors.New("pkg: invalid config"), "pkg: Config")
	for _, tc := range []struct {
		interval time.Duration
		batch    int
		want     string // "" for nil
	}{
		{time.Minute, 1000, ""},
		{-time.Second, 1000, "pkg: Config.RetentionInterval: -1s is negative"},
		{time.Minute, -1, "pkg: Config.RetentionBatch: -1 is negative"},
		{-1, -1, "pkg: Config.RetentionInterval: -1ns is negative"},
	} {
		if got := text(bad.Retention(tc.interval, tc.batch)); got != tc.want {
			t.Fatalf("Retention(%v, %d) = %q, want %q", tc.interval, tc.batch, got, tc.want)
		}
	}
}

// text is err's text, "" for nil.
func text(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
