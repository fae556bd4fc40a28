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
