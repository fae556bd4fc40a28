package printable_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/cmd/oncekit/internal/printable"
	"github.com/oncekit/oncekit/internal/untrusted"
)

var cases = map[string]string{
	"plain":              "plain",
	"a\x1b[2Jb":          `a\x1b[2Jb`,
	"tab\tnl\ncr\r":      `tab\tnl\ncr\r`,
	"back\\slash":        `back\\slash`,
	"csi\u009b31m":       `csi\u009b31m`,
	"bad \xff byte":      `bad \xff byte`,
	"del\x7f":            `del\x7f`,
	"ünïcödé and 日本語 ok": "ünïcödé and 日本語 ok",
}

func TestString(t *testing.T) {
	t.Parallel()
	for in, want := range cases {
		require.Equal(t, want, printable.String(in), "%q", in)
	}
	require.Equal(t, "line 1\n\tline 2 \\x1b", printable.Text("line 1\n\tline 2 \x1b"))
}

// FuzzAgreesWithLibrary: the command escapes exactly what the library
// escapes in what it prints.
func FuzzAgreesWithLibrary(f *testing.F) {
	for in := range cases {
		f.Add(in)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := printable.String(s), untrusted.Printable(s); got != want {
			t.Fatalf("String(%q) = %q, the library's %q", s, got, want)
		}
		if got, want := printable.Text(s), untrusted.PrintableText(s); got != want {
			t.Fatalf("Text(%q) = %q, the library's %q", s, got, want)
		}
	})
}
