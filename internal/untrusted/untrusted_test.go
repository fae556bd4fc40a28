package untrusted_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/untrusted"
)

func TestText(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in string
		max      int
		want     string
	}{
		{"as is", "naïve café", 100, "naïve café"},
		{"invalid byte", "a\xffb", 100, "a\uFFFDb"},
		{"NUL", "a\x00b", 100, "a\uFFFDb"},
		{"cut on a character boundary", "éééééé", 10, "ééé…"}, // é is 2 bytes, … is 3
		{"a cut sequence at the end", "abc\xe2\x82", 100, "abc\uFFFD\uFFFD"},
		{"fits once cleaned", "ab\xff", 8, "ab\uFFFD"},
		{"grows past the cap when cleaned", "\xff\xff\xff\xff", 8, "\uFFFD…"},
		{"empty", "", 10, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := untrusted.Text(tc.in, tc.max)
			require.Equal(t, tc.want, got)
			require.True(t, untrusted.Storable(got))
			require.LessOrEqual(t, len(got), max(tc.max, 8))
		})
	}
}

func TestKey(t *testing.T) {
	t.Parallel()
	require.Equal(t, "evt-1", untrusted.Key("evt-1", 64), "a storable key is kept")
	bad := untrusted.Key("evt\xff", 64)
	require.True(t, untrusted.Storable(bad))
	require.True(t, strings.HasPrefix(bad, "evt\uFFFD~"), bad)
	// Two raw values that clean to the same text stay apart.
	require.NotEqual(t, bad, untrusted.Key("evt\xfe", 64))
	require.NotEqual(t, bad, untrusted.Key("evt\uFFFD", 64))
	// A storable value that looks like a derived key is derived itself,
	// so it cannot take the key of another value.
	require.NotEqual(t, bad, untrusted.Key(bad, 64))
	long := strings.Repeat("x", 5000)
	k := untrusted.Key(long, 256)
	require.LessOrEqual(t, len(k), 256)
	require.NotEqual(t, k, untrusted.Key(long+"y", 256))
}

func TestHeaders(t *testing.T) {
	t.Parallel()
	h := map[string][]string{"a": {"1", "2"}, "b": {"x"}}
	got, exact := untrusted.Headers(h)
	require.True(t, exact)
	require.Equal(t, h, got, "storable headers are kept as they are")

	got, exact = untrusted.Headers(map[string][]string{"a\xff": {"v\x00", "ok"}, "a\xfe": {strings.Repeat("\xff", 100)}, "c": {"z"}})
	require.False(t, exact)
	require.Len(t, got, 3, "two names that clean alike stay apart")
	for name, vs := range got {
		require.True(t, untrusted.Storable(name), name)
		for _, v := range vs {
			require.True(t, untrusted.Storable(v), v)
			require.NotContains(t, v, "…", "every byte is kept")
		}
	}
	require.Equal(t, []string{"z"}, got["c"])
}

// FuzzKey: every key is storable, within its cap, and two inputs never share
// one.
func FuzzKey(f *testing.F) {
	for _, s := range []string{"", "a", "a\x00", "\xff", strings.Repeat("é", 40), "x~0123456789abcdef0123456789abcdef"} {
		f.Add(s, "b")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ka, kb := untrusted.Key(a, 64), untrusted.Key(b, 64)
		for _, k := range []string{ka, kb} {
			if !utf8.ValidString(k) || strings.IndexByte(k, 0) >= 0 || len(k) > 64 {
				t.Fatalf("key %q not storable within 64 bytes", k)
			}
		}
		if a != b && ka == kb {
			t.Fatalf("%q and %q share the key %q", a, b, ka)
		}
		if txt := untrusted.Text(a, 20); !untrusted.Storable(txt) || len(txt) > 20 {
			t.Fatalf("Text(%q) = %q", a, txt)
		}
	})
}

func TestPrintable(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"plain café":              "plain café",
		"\x1b[2J\x1b]0;pwned\x07": `\x1b[2J\x1b]0;pwned\x07`,
		"a\tb\nc\\d":              `a\tb\nc\\d`,
		"csi \u009b31m":           `csi \u009b31m`,
		"bad \xff":                `bad \xff`,
		"bidi \u202e":             `bidi \u202e`,
	} {
		require.Equal(t, want, untrusted.Printable(in), "%q", in)
	}
	require.Equal(t, "line 1\n\tline 2 \\x1b", untrusted.PrintableText("line 1\n\tline 2 \x1b"))
}
