package fleet_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/outbox/fleet"
)

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

func TestAssignIsDeterministicAndSpreads(t *testing.T) {
	t.Parallel()
	members, dbs := names("member", 10), names("db", 1000)
	load := map[string]int{}
	for _, db := range dbs {
		got := fleet.Assign(db, members, 3)
		require.Len(t, got, 3)
		shuffled := slices.Clone(members)
		slices.Reverse(shuffled)
		require.Equal(t, got, fleet.Assign(db, shuffled, 3), "independent of the members' order")
		for _, m := range got {
			load[m]++
		}
	}
	// 3000 assignments over 10 members: 300 each, give or take.
	for _, m := range members {
		require.InDelta(t, 300, load[m], 75, "load of %s", m)
	}
	require.Empty(t, fleet.Assign("db", members, 0))
	require.Len(t, fleet.Assign("db", members[:2], 3), 2, "k above n: every member")
}

// A member's leaving moves only the assignments it held, each to one other
// member: about k/n of the databases see one change, 1/n of all
// assignments.
func TestAssignMemberLeavingMovesItsShareOnly(t *testing.T) {
	t.Parallel()
	const n, k = 10, 3
	members, dbs := names("member", n), names("db", 1000)
	gone := members[4]
	rest := slices.DeleteFunc(slices.Clone(members), func(m string) bool { return m == gone })
	moved := 0
	for _, db := range dbs {
		before, after := fleet.Assign(db, members, k), fleet.Assign(db, rest, k)
		kept := slices.DeleteFunc(slices.Clone(before), func(m string) bool { return m == gone })
		for _, m := range kept {
			require.Contains(t, after, m, "%s kept its other members", db)
		}
		if len(kept) < len(before) {
			moved++
		}
	}
	share := float64(moved) / float64(len(dbs)*k)
	t.Logf("%d of %d assignments moved (%.3f; 1/n = %.3f)", moved, len(dbs)*k, share, 1.0/n)
	require.InDelta(t, 1.0/n, share, 0.3/n, "share of the assignments moved: %d of %d", moved, len(dbs)*k)

	// And joining takes only what the newcomer wins.
	joined := append(slices.Clone(members), "member-new")
	for _, db := range dbs {
		before, after := fleet.Assign(db, members, k), fleet.Assign(db, joined, k)
		for _, m := range after {
			if m != "member-new" {
				require.Contains(t, before, m)
			}
		}
	}
}

func TestBudget(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ parts, k, limit, want int }{
		{16, 3, 5, 5},  // ceil(16/3)+1 = 7, capped
		{16, 3, 10, 7}, // one per partition held, plus one
		{4, 3, 5, 3},
		{1, 3, 5, 2}, // at least 2
		{16, 0, 20, 17},
	} {
		require.Equal(t, c.want, fleet.Budget(c.parts, c.k, c.limit), "%+v", c)
	}
}
