package chaos

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The checker can fail: each deliberately broken build of the payments
// example breaks one guarantee, and the same run that passes on the real
// build ends FAIL naming the invariant it broke. Each broken build must work
// otherwise: at least 90% of the acknowledged payments reach the ledger, so
// that what is caught is the bug, not a build that does nothing.
func TestRunCatchesBrokenBuilds(t *testing.T) {
	if testing.Short() {
		t.Skip("a chaos run takes about a minute")
	}
	for _, tc := range []struct {
		broken string
		// violated must all be named; of anyOf, at least one.
		violated, anyOf []string
		whatBroke       string
	}{
		// Acking on receive moves the ack floor past messages not yet
		// applied, which the ordered consumer's gate trusts (an account's
		// later payments overtake), and loses what a killed consumer held.
		{"ack-before-commit", nil, []string{InvLedgerOnce, InvOrder},
			"messages acked before their transaction committed were applied out of order or lost with the killed consumer"},
		{"fresh-provider-key", []string{InvEffectOnce, InvKeyStable}, nil, "a retried call with a new key made the provider act twice"},
	} {
		t.Run(tc.broken, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
			defer cancel()
			dir, err := os.MkdirTemp("", "oncekit-chaos-test-") // not t.TempDir: the postgres user must reach it
			require.NoError(t, err)
			t.Cleanup(func() { _ = os.RemoveAll(dir) })
			// Kills a fifth as often as the real run's: a consumer that acks
			// on receive loses everything it holds when killed, and the run
			// must still show progress.
			res, err := Run(ctx, Options{Duration: 30 * time.Second, Broken: tc.broken, Dir: dir, Log: tlog{t}, KillEvery: 10 * time.Second})
			require.NoError(t, err)
			t.Log(res.Line())
			require.GreaterOrEqual(t, res.Verdict.Progress(), 0.9, "the broken build stopped making progress")
			require.False(t, res.Verdict.Pass(), "the checker missed it: %s", tc.whatBroke)
			for _, inv := range tc.violated {
				require.Contains(t, res.Verdict.Violated(), inv, tc.whatBroke)
			}
			if len(tc.anyOf) > 0 {
				require.NotEmpty(t, intersect(tc.anyOf, res.Verdict.Violated()), "%s: want one of %v", tc.whatBroke, tc.anyOf)
			}
			require.Contains(t, res.Line(), "verdict=FAIL violated=")
		})
	}
}

func intersect(a, b []string) []string {
	var out []string
	for _, x := range a {
		if slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

type tlog struct{ t *testing.T }

func (l tlog) Write(p []byte) (int, error) {
	l.t.Log(string(p))
	return len(p), nil
}
