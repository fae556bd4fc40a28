package fleet

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/internal/wait"
)

// A listing that races with the other members' refreshes sees every live
// member once: a key rewritten while ListKeys read the bucket (its old
// entry gone, the new one past the lister's end) is not a member gone, and
// one delivered twice is one member. Without the direct look-up of the
// keys missing since the last list and the deduplication, about one list in
// twenty had 29 or 31 to 42 members while thirty refreshed, and the
// members' assignments flapped (seen in make chaos-fleet).
func TestListSeesMembersRefreshingMeanwhile(t *testing.T) {
	t.Parallel()
	n := testenv.NewNATS(t)
	cfg := (&Config{Bucket: testenv.Name(t), MemberTTL: 3 * time.Second}).withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const size = 30
	var wg sync.WaitGroup
	defer wg.Wait()
	var self *members
	for i := range size {
		c := cfg
		c.ID = fmt.Sprintf("m%02d", i)
		m, err := joinBucket(ctx, n.JS, &c)
		require.NoError(t, err)
		require.NoError(t, m.refresh(ctx))
		if i == 0 {
			self = m
			continue
		}
		wg.Go(func() {
			wait.Every(ctx, 20*time.Millisecond, func(ctx context.Context) { _ = m.refresh(ctx) })
		})
	}
	short := 0
	for i := range 201 {
		ids, err := self.list(ctx)
		require.NoError(t, err)
		if i > 0 && len(ids) != size { // the first has no previous list to go by
			t.Logf("list %d: %d members", i, len(ids))
			short++
		}
	}
	cancel()
	require.Zero(t, short, "lists of 200 that missed a live member")
}

// A look that finds more than a quarter of the members gone at once is
// not believed until the loss has lasted a MemberTTL (a NATS node that just
// restarted answers from a replica not caught up yet); a smaller loss is
// believed at once, and a loss that the looks stop finding is forgotten.
func TestListConfirmsAMassDeparture(t *testing.T) {
	t.Parallel()
	n := testenv.NewNATS(t)
	const ttl = 2 * time.Second
	cfg := (&Config{Bucket: testenv.Name(t), MemberTTL: time.Minute}).withDefaults()
	ctx := context.Background()
	var all []*members
	for i := range 10 {
		c := cfg
		c.ID = fmt.Sprintf("m%02d", i)
		m, err := joinBucket(ctx, n.JS, &c)
		require.NoError(t, err)
		require.NoError(t, m.refresh(ctx))
		all = append(all, m)
	}
	self := all[0]
	self.ttl = ttl // entries live a minute; the loss is believed after ttl
	list := func() int {
		ids, err := self.list(ctx)
		require.NoError(t, err)
		return len(ids)
	}
	require.Equal(t, 10, list())
	for _, m := range all[8:] { // 2 of 10 leave: believed at once
		require.NoError(t, m.leave(ctx))
	}
	require.Equal(t, 8, list())
	for _, m := range all[3:8] { // 5 of 8 leave at once
		require.NoError(t, m.leave(ctx))
	}
	start := time.Now()
	require.Equal(t, 8, list(), "more than a quarter gone at once is not believed at first")
	require.Eventually(t, func() bool { return list() == 3 }, 10*time.Second, 50*time.Millisecond)
	require.GreaterOrEqual(t, time.Since(start), ttl, "believed once the loss lasted a MemberTTL")

	// A loss that the looks stop finding is forgotten.
	for _, m := range all[3:10] {
		require.NoError(t, m.refresh(ctx))
	}
	require.Equal(t, 10, list())
	for _, m := range all[3:10] {
		require.NoError(t, m.leave(ctx))
	}
	require.Equal(t, 10, list())
	for _, m := range all[3:10] {
		require.NoError(t, m.refresh(ctx))
	}
	require.Equal(t, 10, list(), "back at the next look: no change seen")
	for _, m := range all[3:10] {
		require.NoError(t, m.leave(ctx))
	}
	require.Equal(t, 10, list(), "a new loss waits a MemberTTL again")
}
