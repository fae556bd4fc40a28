package redact_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/redact"
)

func TestString(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"nats://app:S3cret@127.0.0.1:4222", "nats://app:xxxxx@127.0.0.1:4222"},
		{"nats://TOKEN@host:4222", "nats://xxxxx@host:4222"},
		{"postgres://app:p@ss:w/rd@db.internal:5432/orders", "postgres://app:xxxxx@db.internal:5432/orders"},
		{"postgres://app:p@ss@h1,h2/db?sslmode=disable", "postgres://app:xxxxx@h1,h2/db?sslmode=disable"},
		{"postgres://app@h/db?password=S3cret&sslmode=disable", "postgres://xxxxx@h/db?password=xxxxx&sslmode=disable"},
		{"dial postgres://app:S3cret@h/db and host=h password=S3cret user=u", "dial postgres://app:xxxxx@h/db and host=h password=xxxxx user=u"},
		{"password='a b c' host=h", "password=xxxxx host=h"},
		{"nats://a:x@h1:4222,nats://TOK@h2:4222", "nats://a:xxxxx@h1:4222,nats://xxxxx@h2:4222"},
		{"amqp://guest:guest@127.0.0.1:5672/ failed", "amqp://guest:xxxxx@127.0.0.1:5672/ failed"},
		{"https://hooks.example.com/p?email=a@b.c", "https://hooks.example.com/p?email=a@b.c"},
		{"no url here", "no url here"},
		{"redis://:S3cret@127.0.0.1:6379/0", "redis://xxxxx@127.0.0.1:6379/0"},
	} {
		require.Equal(t, tc.want, redact.String(tc.in), tc.in)
	}
	u, err := url.Parse("https://TOKEN@hooks.example.com/in")
	require.NoError(t, err)
	require.Equal(t, "https://xxxxx@hooks.example.com/in", redact.URL(u))
}

// FuzzString: a password placed in a URL never survives redaction.
func FuzzString(f *testing.F) {
	for _, s := range []string{"S3cret", "p@ss", "a:b", "x/y?z", "tok"} {
		f.Add(s, "host")
	}
	f.Fuzz(func(t *testing.T, secret, host string) {
		if len(secret) < 4 || strings.ContainsAny(secret, " \t\r\n\"'<>`,?#") || strings.ContainsAny(host, "@/?#: \t\r\n\"'<>`") || host == "" {
			t.Skip()
		}
		// Each URL with the redaction it must get: a secret found in that
		// (in the host, say) proves nothing.
		urls := map[string]string{"postgres://app:" + secret + "@" + host + "/db": "postgres://app:xxxxx@" + host + "/db"}
		if !strings.Contains(secret, ":") { // a token (with a ':' it is a user and a password)
			urls["nats://"+secret+"@"+host+":4222"] = "nats://xxxxx@" + host + ":4222"
		}
		for s, want := range urls {
			if strings.Contains(want, secret) {
				continue
			}
			if out := redact.String(s); strings.Contains(out, secret) {
				t.Fatalf("%q redacted to %q", s, out)
			}
		}
	})
}
