package fleet

import (
	"cmp"
	"hash/fnv"
	"slices"
)

// Assign returns the k members that serve database (rendezvous, or highest
// random weight, hashing): each member's weight for the database is a hash
// of the pair, and the k heaviest win. It is deterministic and needs no
// coordination: every member computes the same answer from the same member
// list, and a member's leaving reassigns only the databases it served, each
// to the next heaviest member (about 1/n of the assignments). With k at or
// above len(members) every member serves every database. The result is in
// weight order; members must be distinct.
func Assign(database string, members []string, k int) []string {
	if k <= 0 || len(members) == 0 {
		return nil
	}
	type weighted struct {
		member string
		w      uint64
	}
	ws := make([]weighted, len(members))
	for i, m := range members {
		ws[i] = weighted{m, weight(m, database)}
	}
	slices.SortFunc(ws, func(a, b weighted) int {
		if c := cmp.Compare(b.w, a.w); c != 0 {
			return c
		}
		return cmp.Compare(a.member, b.member)
	})
	out := make([]string, 0, min(k, len(ws)))
	for _, w := range ws[:min(k, len(ws))] {
		out = append(out, w.member)
	}
	return out
}

// Member is a live member of a fleet and its group: the process, host or
// zone it shares with other members, whose death takes them all.
type Member struct {
	ID    string
	Group string
}

// AssignSpread is Assign over members in groups: the k members that serve
// database are taken in Assign's order, skipping a member whose group
// already has one of them, so that one group's death takes at most one of
// a database's members while there are k groups. With fewer groups, the
// members skipped fill the places left, in the same order. Like Assign it
// needs no coordination, and a member's leaving or joining changes only
// the databases it serves or wins. With every member in a group of its
// own, it is Assign.
func AssignSpread(database string, members []Member, k int) []string {
	ids := make([]string, len(members))
	group := make(map[string]string, len(members))
	for i, m := range members {
		ids[i] = m.ID
		group[m.ID] = m.Group
	}
	order := Assign(database, ids, len(ids))
	out := make([]string, 0, min(k, len(order)))
	taken := make(map[string]bool, k)
	var skipped []string
	for _, id := range order {
		if len(out) == k {
			break
		}
		if taken[group[id]] {
			skipped = append(skipped, id)
			continue
		}
		taken[group[id]] = true
		out = append(out, id)
	}
	for _, id := range skipped {
		if len(out) == k {
			break
		}
		out = append(out, id)
	}
	return out
}

// weight is member's weight for database: FNV-1a over both (with a
// separator no name contains), finished by splitmix64's mixer so that
// names differing in their last bytes spread over the whole range.
func weight(member, database string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(member))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(database))
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Budget is the most connections a member opens to a database of partitions
// partitions that k members serve: one per partition it holds there (about
// partitions/k, rounded up) plus one for its lease, probe and stats
// statements, at most limit and at least 2.
func Budget(partitions, k, limit int) int {
	k = max(k, 1)
	return max(min((partitions+k-1)/k+1, limit), 2)
}
