package inbox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func laneItem(key string, seq uint64) *item { return &item{key: key, seq: seq} }

func seqsOf(items []*item) []uint64 {
	var out []uint64
	for _, it := range items {
		out = append(out, it.seq)
	}
	return out
}

// A lane hands out its messages in sequence order (a redelivery goes back
// before what overtook it); a held message holds back the later messages
// of its key only, until its wait ends or its key is woken.
func TestOrderedLane(t *testing.T) {
	t.Parallel()
	l := newOrderedLane()
	for _, it := range []*item{laneItem("a", 5), laneItem("b", 6), laneItem("a", 7)} {
		l.put(it)
	}
	l.put(laneItem("a", 2)) // a redelivery
	got, ok := l.next(2)
	require.True(t, ok)
	require.Equal(t, []uint64{2, 5}, seqsOf(got))

	l.hold(got[1:]) // a/5 waits for something elsewhere
	got, _ = l.next(10)
	require.Equal(t, []uint64{6}, seqsOf(got), "b goes on; a/7 waits behind a/5")

	l.wake(map[string]bool{"a": true})
	got, _ = l.next(10)
	require.Equal(t, []uint64{5, 7}, seqsOf(got))

	l.hold([]*item{laneItem("c", 9)})
	start := time.Now()
	got, _ = l.next(10)
	require.Equal(t, []uint64{9}, seqsOf(got), "a held message comes back when its wait ends")
	require.GreaterOrEqual(t, time.Since(start), holdFirst)

	l.put(laneItem("d", 10))
	l.hold([]*item{laneItem("d", 3)})
	l.close()
	got, ok = l.next(10)
	require.True(t, ok)
	require.Equal(t, []uint64{3, 10}, seqsOf(got), "closed: everything, held or not, to be handed back")
	_, ok = l.next(10)
	require.False(t, ok)
}
