package cfgerr

import (
	"errors"
	"strings"
	"testing"
	"time"
)

type config struct {
	N    int
	D    time.Duration
	L    int64
	M    int
	Name string
}

func TestIfNegative(t *testing.T) {
	t.Parallel()
	sentinel := errors.New("pkg: invalid config")
	bad := For(sentinel, "pkg: Config")
	for _, tc := range []struct {
		c     config
		names []string
		want  string // "" for nil
	}{
		{config{}, nil, ""},
		{config{}, []string{"N", "D", "L"}, ""},
		{config{N: 1, D: time.Second}, []string{"N", "D"}, ""},
		{config{N: -1}, []string{"N"}, "pkg: Config.N: -1 is negative"},
		{config{N: -1}, []string{"D", "L"}, ""}, // only the fields named
		{config{L: -2}, []string{"L"}, "pkg: Config.L: -2 is negative"},
		{config{D: -time.Second}, []string{"D"}, "pkg: Config.D: -1s is negative"},
		{config{N: 1, D: -1, M: -1}, []string{"N", "D", "M"}, "pkg: Config.D: -1ns is negative"},
	} {
		for _, c := range []any{tc.c, &tc.c} { // a Config or a pointer to one
			err := bad.IfNegative(c, tc.names...)
			if got := text(err); got != tc.want {
				t.Fatalf("IfNegative(%+v, %q) = %q, want %q", tc.c, tc.names, got, tc.want)
			}
			if err != nil && !errors.Is(err, sentinel) {
				t.Fatalf("%v does not wrap the sentinel", err)
			}
		}
	}
}

func TestIfNotID(t *testing.T) {
	t.Parallel()
	bad := For(errors.New("pkg: invalid config"), "pkg: Config")
	for _, tc := range []struct {
		name string
		want string // "" for nil
	}{
		{"", ""},
		{"host-1234-0a1b2c3d", ""},
		{"relé 東京", ""},
		{strings.Repeat("x", MaxIDBytes), ""},
		{strings.Repeat("x", MaxIDBytes+1), "pkg: Config.Name: 256 bytes, over 255"},
		{"a\x00b", `pkg: Config.Name: "a\x00b" holds a control character`},
		{"a\nb", `pkg: Config.Name: "a\nb" holds a control character`},
		{"a\xffb", "pkg: Config.Name: not valid UTF-8"},
	} {
		if got := text(bad.IfNotID(config{Name: tc.name}, "Name")); got != tc.want {
			t.Errorf("IfNotID(%q) = %q, want %q", tc.name, got, tc.want)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("IfNotID(config, \"N\") did not panic on an integer field")
		}
	}()
	_ = bad.IfNotID(config{}, "N")
}

func TestIfNegativePanicsOnANameThatIsNoIntegerField(t *testing.T) {
	t.Parallel()
	bad := For(errors.New("pkg: invalid config"), "pkg: Config")
	for _, name := range []string{"Missing", "Name", "n"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("IfNegative(config, %q) did not panic", name)
				}
			}()
			_ = bad.IfNegative(config{}, name)
		}()
	}
}

// text is err's text, "" for nil.
func text(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
