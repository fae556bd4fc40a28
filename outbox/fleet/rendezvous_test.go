package fleet_test

import (
	"fmt"
	"slices"
	"strings"
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

// grouped returns n members in groups of size, named as make chaos-fleet
// names them: the group (process), then the member.
func grouped(groups, size int) []fleet.Member {
	var out []fleet.Member
	for g := range groups {
		for i := range size {
			out = append(out, fleet.Member{ID: fmt.Sprintf("p%d-m%d", g, i), Group: fmt.Sprintf("p%d", g)})
		}
	}
	return out
}

func groupOf(ms []fleet.Member) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		out[m.ID] = m.Group
	}
	return out
}

// With k groups or more, a database's k members are in k different
// groups, so that a group's death takes one of them at most; rendezvous
// hashing alone put two or three of them in one group for about a third
// of the databases (30 members in 5 groups, k = 3). With fewer groups the
// places left are filled; with a group per member it is Assign.
func TestAssignSpreadTakesAMemberPerGroup(t *testing.T) {
	t.Parallel()
	const k = 3
	ms, dbs := grouped(5, 6), names("db", 1000)
	group := groupOf(ms)
	ids := make([]string, len(ms))
	for i, m := range ms {
		ids[i] = m.ID
	}
	shared, load := 0, map[string]int{}
	for _, db := range dbs {
		got := fleet.AssignSpread(db, ms, k)
		require.Len(t, got, k)
		groups := map[string]bool{}
		for _, id := range got {
			groups[group[id]] = true
			load[id]++
		}
		require.Len(t, groups, k, "%s: %v", db, got)
		plain := map[string]bool{}
		for _, id := range fleet.Assign(db, ids, k) {
			plain[group[id]] = true
		}
		if len(plain) < k {
			shared++
		}
	}
	t.Logf("rendezvous alone: %d of %d databases with two or more members in one group", shared, len(dbs))
	require.Greater(t, shared, len(dbs)/10, "the test's fleet does not show what spreading is for")
	for _, id := range ids {
		require.InDelta(t, 100, load[id], 40, "load of %s", id) // 3000 over 30
	}

	two := grouped(2, 3)
	for _, db := range dbs[:100] {
		got := fleet.AssignSpread(db, two, k)
		require.Len(t, got, k, "two groups, k = 3: a group serves twice")
		require.NotEqual(t, groupOf(two)[got[0]], groupOf(two)[got[1]], "%s: the first two in one group", db)
	}

	own := make([]fleet.Member, len(ids))
	for i, id := range ids {
		own[i] = fleet.Member{ID: id, Group: id}
	}
	for _, db := range dbs[:100] {
		require.Equal(t, fleet.Assign(db, ids, k), fleet.AssignSpread(db, own, k))
	}
}

// With groups, a member's leaving still moves only the databases it
// served, and a group's death takes one member of each database at most.
func TestAssignSpreadGroupLeavingMovesItsShareOnly(t *testing.T) {
	t.Parallel()
	const k = 3
	ms, dbs := grouped(5, 6), names("db", 1000)
	rest := slices.DeleteFunc(slices.Clone(ms), func(m fleet.Member) bool { return m.Group == "p2" })
	moved := 0
	for _, db := range dbs {
		before, after := fleet.AssignSpread(db, ms, k), fleet.AssignSpread(db, rest, k)
		kept := slices.DeleteFunc(slices.Clone(before), func(id string) bool { return strings.HasPrefix(id, "p2-") })
		require.GreaterOrEqual(t, len(kept), k-1, "%s lost more than one member with its group", db)
		for _, id := range kept {
			require.Contains(t, after, id, "%s kept its other members", db)
		}
		moved += len(before) - len(kept)
	}
	share := float64(moved) / float64(len(dbs)*k)
	t.Logf("%d of %d assignments moved with one group of five (%.3f)", moved, len(dbs)*k, share)
	require.InDelta(t, 0.2, share, 0.05)
}
