package fleet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A member list is acted on once it has stood for a look: one seen once (a
// member that missed a refresh, members still joining) moves nothing; a
// list that keeps changing is taken after a MemberTTL.
func TestAdoptWaitsForAListToStand(t *testing.T) {
	f := &Fleet{cfg: Config{MemberTTL: 3 * time.Second}}
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	abc, ab := []string{"a", "b", "c"}, []string{"a", "b"}

	require.False(t, f.adopt(abc, at(0)), "a first list is adopted only once it stands")
	require.Nil(t, f.members)
	require.True(t, f.adopt(abc, at(time.Second)))
	require.Equal(t, abc, f.members)

	// c misses a refresh: one look without it, then it is back.
	require.False(t, f.adopt(ab, at(2*time.Second)))
	require.False(t, f.adopt(abc, at(3*time.Second)))
	require.Equal(t, abc, f.members)

	// c is gone: the list without it is taken at the second look.
	require.False(t, f.adopt(ab, at(4*time.Second)))
	require.False(t, f.adopt(ab, at(4*time.Second+500*time.Millisecond)), "a look sooner than MemberTTL/3 (a Set) confirms nothing")
	require.True(t, f.adopt(ab, at(5*time.Second)))
	require.Equal(t, ab, f.members)

	// Lists that change at every look are taken a MemberTTL after they began to.
	lists := [][]string{{"a"}, {"a", "b", "d"}, {"a", "d"}, {"a", "b", "c", "d"}}
	for i, l := range lists[:3] {
		require.False(t, f.adopt(l, at(6*time.Second+time.Duration(i)*time.Second)))
	}
	require.True(t, f.adopt(lists[3], at(9*time.Second)))
	require.Equal(t, lists[3], f.members)
}
