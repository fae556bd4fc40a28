package fleet

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/internal/wait"
)

// joinAll joins size members to a new bucket whose MemberTTL is ttl, on a
// NATS server of the test's own, each refreshed once; they stop watching
// at the test's end.
func joinAll(t *testing.T, ttl time.Duration, size int) []*members {
	t.Helper()
	n := testenv.NewNATS(t)
	cfg := (&Config{Bucket: testenv.Name(t), MemberTTL: ttl}).withDefaults()
	ctx := context.Background()
	all := make([]*members, size)
	for i := range all {
		c := cfg
		c.ID = fmt.Sprintf("m%02d", i)
		c.Group = c.ID
		m, err := joinBucket(ctx, n.JS, &c)
		require.NoError(t, err)
		t.Cleanup(m.close)
		require.NoError(t, m.refresh(ctx))
		all[i] = m
	}
	return all
}

// look is what a member's look does with its entry: refresh it, then list.
func look(t *testing.T, m *members) []string {
	t.Helper()
	require.NoError(t, m.refresh(context.Background()))
	ids, err := m.list(context.Background())
	require.NoError(t, err)
	return ids
}

// refreshing keeps m's entry refreshed every d until stop is called.
func refreshing(m *members, d time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { wait.Every(ctx, d, func(ctx context.Context) { _ = m.refresh(ctx) }) })
	return func() { cancel(); wg.Wait() }
}

// While the other members refresh ten times a look, every look sees each
// of them once. A listing of the bucket raced with the refreshes (a
// key rewritten while it was read is missed or read twice): about one list
// in twenty had 29 or 31 to 42 members while thirty refreshed, and the
// members' assignments flapped (seen in make chaos-fleet).
func TestListSeesMembersRefreshingMeanwhile(t *testing.T) {
	t.Parallel()
	const size, ttl = 30, 3 * time.Second
	all := joinAll(t, ttl, size)
	for _, m := range all[1:] {
		t.Cleanup(refreshing(m, ttl/30))
	}
	short := 0
	for i := range 200 {
		if ids := look(t, all[0]); len(ids) != size {
			t.Logf("look %d: %d members", i, len(ids))
			short++
		}
	}
	require.Zero(t, short, "looks of 200 that missed a live member or saw one twice")
}

// A member that stops refreshing without leaving (killed) drops out of the
// others' lists once its last refresh is a MemberTTL older than theirs;
// one that leaves drops out at the next look. Both are judged by the
// server's timestamps: no member's clock is read.
func TestListDropsASilentMemberAfterTheTTL(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	all := joinAll(t, ttl, 3)
	t.Cleanup(refreshing(all[1], ttl/6))
	stopped := time.Now()
	require.NoError(t, all[2].refresh(context.Background())) // its last
	require.Equal(t, []string{"m00", "m01", "m02"}, look(t, all[0]))
	require.Eventually(t, func() bool { return len(look(t, all[0])) == 2 }, 3*ttl, ttl/20)
	require.GreaterOrEqual(t, time.Since(stopped), ttl, "a silent member stays listed for a MemberTTL")
	require.Equal(t, []string{"m00", "m01"}, look(t, all[0]))

	require.NoError(t, all[1].leave(context.Background()))
	require.Equal(t, []string{"m00"}, look(t, all[0]), "a member that left is gone at the next look")
}

// A member lists nothing before its first refresh has come back through
// its watch: it keeps no list it could not date.
func TestListWaitsForTheMembersOwnRefresh(t *testing.T) {
	t.Parallel()
	n := testenv.NewNATS(t)
	cfg := (&Config{Bucket: testenv.Name(t), MemberTTL: 300 * time.Millisecond, ID: "m"}).withDefaults()
	m, err := joinBucket(context.Background(), n.JS, &cfg)
	require.NoError(t, err)
	t.Cleanup(m.close)
	_, err = m.list(context.Background())
	require.ErrorIs(t, err, errWatchBehind)
	require.Equal(t, []string{"m"}, look(t, m))
}

// A look that finds more than a quarter of the members gone at once is
// not believed until the loss has lasted a MemberTTL (a NATS node that just
// restarted can serve a watch not caught up yet); a smaller loss is
// believed at once, and a loss that the looks stop finding is forgotten.
func TestListConfirmsAMassDeparture(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	all := joinAll(t, ttl, 10)
	// Members 1 and 2 stay; 3 to 9 leave and come back by hand.
	t.Cleanup(refreshing(all[1], ttl/6))
	t.Cleanup(refreshing(all[2], ttl/6))
	self := all[0]
	list := func() int { return len(look(t, self)) }
	leave := func(ms []*members) {
		for _, m := range ms {
			require.NoError(t, m.leave(context.Background()))
		}
	}
	refresh := func(ms []*members) {
		for _, m := range ms {
			require.NoError(t, m.refresh(context.Background()))
		}
	}
	require.Equal(t, 10, list())
	leave(all[8:]) // 2 of 10: believed at once
	require.Equal(t, 8, list())
	leave(all[3:8]) // 5 of 8 at once
	start := time.Now()
	require.Equal(t, 8, list(), "more than a quarter gone at once is not believed at first")
	require.Eventually(t, func() bool { return list() == 3 }, 10*time.Second, 50*time.Millisecond)
	require.GreaterOrEqual(t, time.Since(start), ttl, "believed once the loss lasted a MemberTTL")

	// A loss that the looks stop finding is forgotten.
	refresh(all[3:])
	require.Equal(t, 10, list())
	leave(all[3:])
	require.Equal(t, 10, list())
	refresh(all[3:])
	require.Equal(t, 10, list(), "back at the next look: no change seen")
	leave(all[3:])
	require.Equal(t, 10, list(), "a new loss waits a MemberTTL again")
}

// Entries the members did not write are not members: a key that is not
// base64url, and keys that decode to an ID no member could have (a NUL,
// bytes that are not UTF-8, a line break, over 255 bytes), are left out of every list, whatever
// their value, while the real members are listed as before.
func TestListIgnoresEntriesNoMemberWrote(t *testing.T) {
	t.Parallel()
	all := joinAll(t, 2*time.Second, 2)
	ctx := context.Background()
	kv := all[0].kv
	for _, key := range []string{
		"not=base64",
		memberKey("nul\x00member"),
		memberKey("\xff\xfe"),
		memberKey(strings.Repeat("m", 300)), // over 255 bytes
		memberKey("line\nbreak"),
	} {
		_, err := kv.Put(ctx, key, []byte("\x00\xff garbage"))
		require.NoError(t, err, "%.40q", key)
	}
	_, err := kv.Put(ctx, memberKey("m09"), []byte("anything")) // a well-formed ID is one
	require.NoError(t, err)
	require.Equal(t, []string{"m00", "m01", "m09"}, look(t, all[0]))
}

// Each member reads the others' groups from their entries. An entry whose
// value is not an ID (written by something else) makes its member a group
// of its own, as does a member the watch has not delivered yet.
func TestMembersReadEachOthersGroups(t *testing.T) {
	t.Parallel()
	n := testenv.NewNATS(t)
	ctx := context.Background()
	bucket := testenv.Name(t)
	var all []*members
	for _, c := range []Config{{ID: "p1-m0", Group: "p1"}, {ID: "p1-m1", Group: "p1"}, {ID: "p2-m0", Group: "p2"}} {
		c.Bucket, c.MemberTTL = bucket, 3*time.Second
		c = c.withDefaults()
		m, err := joinBucket(ctx, n.JS, &c)
		require.NoError(t, err)
		t.Cleanup(m.close)
		require.NoError(t, m.refresh(ctx))
		all = append(all, m)
	}
	_, err := all[0].kv.Put(ctx, memberKey("odd"), []byte("bad\x00group"))
	require.NoError(t, err)

	ids := look(t, all[0])
	require.Equal(t, []string{"odd", "p1-m0", "p1-m1", "p2-m0"}, ids)
	require.Equal(t, []Member{{"odd", "odd"}, {"p1-m0", "p1"}, {"p1-m1", "p1"}, {"p2-m0", "p2"}, {"unseen", "unseen"}},
		all[0].spread(append(ids, "unseen")))
}
