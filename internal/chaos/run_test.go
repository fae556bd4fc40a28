package chaos

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The checker can fail: each deliberately broken build of the payments
// example breaks one guarantee, and the same run that passes on the real
// build ends FAIL naming the invariant it broke.
func TestRunCatchesBrokenBuilds(t *testing.T) {
	if testing.Short() {
		t.Skip("a chaos run takes about a minute")
	}
	for _, tc := range []struct {
		broken    string
		violated  []string
		whatBroke string
	}{
		{"ack-before-commit", []string{InvLedgerOnce}, "messages acked before their transaction committed were lost with the killed consumer"},
		{"fresh-provider-key", []string{InvEffectOnce, InvKeyStable}, "a retried call with a new key made the provider act twice"},
	} {
		t.Run(tc.broken, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
			defer cancel()
			dir, err := os.MkdirTemp("", "oncekit-chaos-test-") // not t.TempDir: the postgres user must reach it
			require.NoError(t, err)
			t.Cleanup(func() { _ = os.RemoveAll(dir) })
			res, err := Run(ctx, Options{Duration: 30 * time.Second, Broken: tc.broken, Dir: dir, Log: tlog{t}})
			require.NoError(t, err)
			t.Log(res.Line())
			require.False(t, res.Verdict.Pass(), "the checker missed it: %s", tc.whatBroke)
			for _, inv := range tc.violated {
				require.Contains(t, res.Verdict.Violated(), inv, tc.whatBroke)
			}
			require.Contains(t, res.Line(), "verdict=FAIL violated=")
		})
	}
}

type tlog struct{ t *testing.T }

func (l tlog) Write(p []byte) (int, error) {
	l.t.Log(string(p))
	return len(p), nil
}
