package sideeffect

import "testing"

// Claims follow the rate calls finish: BatchSize while few finish per round,
// four times the round's outcomes when more do, never past 5×BatchSize.
func TestClaimSizeFollowsFinishedCalls(t *testing.T) {
	t.Parallel()
	d := &Dispatcher{cfg: DispatcherConfig{BatchSize: 200, Concurrency: 64}, maxClaim: 1000}
	for _, c := range []struct{ outcomes, want int }{
		{0, 200}, {10, 200}, {50, 200}, {100, 400}, {180, 720}, {250, 1000}, {500, 1000}, {3, 200},
	} {
		d.sizeClaims(c.outcomes)
		if got := d.claimSize.Load(); got != int64(c.want) {
			t.Errorf("after a round of %d outcomes: claim size %d, want %d", c.outcomes, got, c.want)
		}
		if got, want := d.capacity(), int64(128+c.want); got != want {
			t.Errorf("after a round of %d outcomes: capacity %d, want %d", c.outcomes, got, want)
		}
	}
}
