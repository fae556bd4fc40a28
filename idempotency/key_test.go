package idempotency_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
)

func TestParseKey(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", idempotency.MaxKeyLen)
	valid := []struct{ in, want string }{
		{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{`8e03978e-40d5-43e8-bc93-6894a57f9324`, "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{`  "spaced key"  `, "spaced key"},
		{`"quote \" and backslash \\"`, `quote " and backslash \`},
		{`order:42/attempt`, "order:42/attempt"},
		{`"` + long + `"`, long},
		{long, long},
	}
	for _, c := range valid {
		got, err := idempotency.ParseKey(c.in)
		require.NoError(t, err, c.in)
		require.Equal(t, c.want, got)
	}
	invalid := []string{
		``, `   `, `""`, `" "`, `"unterminated`, `"bad \n escape"`, `"trailing" x`, `"a";param=1`,
		`a b`, `a,b`, "\"ctl\x01\"", "ctl\x7f", "\"tab\tinside\"", `"ключ"`, "ключ", `"` + long + `k"`, long + "k",
	}
	for _, in := range invalid {
		_, err := idempotency.ParseKey(in)
		require.ErrorIs(t, err, idempotency.ErrInvalidKey, "%q", in)
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{`"abc"`, `abc`, `"a\"b"`, `""`, "\"\x00\"", `"a";b`, strings.Repeat("x", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		key, err := idempotency.ParseKey(in)
		if err != nil {
			return
		}
		if key == "" || len(key) > idempotency.MaxKeyLen {
			t.Fatalf("accepted key of length %d from %q", len(key), in)
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("accepted non-printable byte %#x from %q", key[i], in)
			}
		}
		// The sf-string serialisation of the key parses back to it.
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		again, err := idempotency.ParseKey(quoted)
		if err != nil || again != key {
			t.Fatalf("round trip of %q via %q: %q, %v", key, quoted, again, err)
		}
	})
}
