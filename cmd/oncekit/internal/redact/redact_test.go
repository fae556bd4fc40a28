package redact_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/cmd/oncekit/internal/redact"
	library "github.com/oncekit/oncekit/internal/redact"
)

var cases = []struct{ in, want string }{
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
}

func TestString(t *testing.T) {
	t.Parallel()
	for _, tc := range cases {
		require.Equal(t, tc.want, redact.String(tc.in), tc.in)
	}
}

// FuzzAgreesWithLibrary: the command masks exactly what the library masks
// in its own errors.
func FuzzAgreesWithLibrary(f *testing.F) {
	for _, tc := range cases {
		f.Add(tc.in)
	}
	f.Add("token=abc secret = 'x y' api-key=k, pwd=1;")
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := redact.String(s), library.String(s); got != want {
			t.Fatalf("%q: the command prints %q, the library %q", s, got, want)
		}
	})
}
