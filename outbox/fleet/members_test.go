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
