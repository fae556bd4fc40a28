package fleet_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/outbox/fleet"
)

// served reports whether every member serves exactly what Assign gives it
// over ids, the members they all see.
func served(ms map[string]*member, dbs []fleet.Database, k int) bool {
	ids := make([]string, 0, len(ms))
	for id := range ms {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for id, m := range ms {
		if !slices.Equal(m.f.Members(), ids) {
			return false
		}
		var want []string
		for _, d := range dbs {
			if slices.Contains(fleet.Assign(d.Name, ids, k), id) {
				want = append(want, d.Name)
			}
		}
		slices.Sort(want)
		if !slices.Equal(m.f.Databases(), want) {
			return false
		}
	}
	return true
}

// Members find each other through the bucket and serve the databases
// rendezvous hashing gives them, each by k of them; when one leaves, the
// others take its databases over.
func TestMembersShareDatabasesByRendezvous(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	var dbs []fleet.Database
	for i := range 6 {
		dbs = append(dbs, newOutboxDB(t, fmt.Sprintf("db%d", i)).def)
	}
	ms := map[string]*member{}
	for _, id := range []string{"m1", "m2", "m3"} {
		ms[id] = w.start(t, w.config(id), dbs...)
	}
	require.Eventually(t, func() bool { return served(ms, dbs, 2) }, 60*time.Second, 50*time.Millisecond,
		"each database served by the 2 members Assign gives it")
	total := 0
	for _, m := range ms {
		total += len(m.f.Databases())
	}
	require.Equal(t, 2*len(dbs), total, "each database by k=2 members, not by all 3")

	ms["m2"].stop()
	delete(ms, "m2")
	require.Eventually(t, func() bool { return served(ms, dbs, 2) }, 60*time.Second, 50*time.Millisecond,
		"the two left serve every database")
	for _, m := range ms {
		require.Len(t, m.f.Databases(), len(dbs))
	}
}

// Writers keep committing into three databases while members leave and
// join: every event is published, each exactly once (the partition
// leases, not the assignment, keep two members from both publishing it).
func TestEveryEventPublishedOnceAcrossMembers(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	var outs []*outboxDB
	var dbs []fleet.Database
	for i := range 3 {
		o := newOutboxDB(t, fmt.Sprintf("db%d", i))
		outs = append(outs, o)
		dbs = append(dbs, o.def)
	}
	m1 := w.start(t, w.config("m1"), dbs...)
	m2 := w.start(t, w.config("m2"), dbs...)
	_ = w.start(t, w.config("m3"), dbs...)

	var mu sync.Mutex
	var all []broker.Message
	stop := make(chan struct{})
	var writers sync.WaitGroup
	var once sync.Once
	halt := func() { once.Do(func() { close(stop) }); writers.Wait() }
	t.Cleanup(halt) // before the schemas are dropped
	for i, o := range outs {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
				msgs, err := w.tryEnqueue(o, fmt.Sprintf("k%d-%d", i, j%7), 5)
				if err != nil {
					t.Errorf("enqueue: %v", err)
					return
				}
				mu.Lock()
				all = append(all, msgs...)
				mu.Unlock()
			}
		}()
	}
	written := func() []broker.Message {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(all)
	}
	require.Eventually(t, func() bool { return w.pub.published(written()) > 300 }, 60*time.Second, 20*time.Millisecond)
	m1.stop() // leaves: its databases move while writers write
	require.Eventually(t, func() bool { return w.pub.published(written()) > 900 }, 60*time.Second, 20*time.Millisecond)
	_ = w.start(t, w.config("m4"), dbs...) // joins: takes some over
	m2.stop()
	require.Eventually(t, func() bool { return w.pub.published(written()) > 1500 }, 60*time.Second, 20*time.Millisecond)
	halt()
	msgs := written()
	w.pub.waitPublished(t, msgs, 60*time.Second)
	w.requireStoredOnce(t, msgs)
	t.Logf("%d events over %d databases, each in the stream once", len(msgs), len(outs))
}

// Two fleets (two buckets) pointed at one database do not see each other:
// both serve it, their relays share its partitions through the leases,
// and every event is published once.
func TestTwoFleetsOnOneDatabasePublishOnce(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	d := newOutboxDB(t, "shared")
	a, b := w.config("a1"), w.config("b1")
	b.Bucket = w.name + "_other"
	w.start(t, a, d.def)
	w.start(t, b, d.def)
	owners := func() (n int) {
		require.NoError(t, d.db.Pool.QueryRow(context.Background(),
			`SELECT count(DISTINCT owner) FROM relay_partitions WHERE expires_at > now()`).Scan(&n))
		return n
	}
	require.Eventually(t, func() bool { return owners() == 2 }, 60*time.Second, 20*time.Millisecond, "both fleets hold leases")
	var msgs []broker.Message
	for i := range 20 {
		msgs = append(msgs, w.enqueue(t, d, fmt.Sprintf("k%d", i), 25)...)
	}
	w.pub.waitPublished(t, msgs, 60*time.Second)
	w.pub.requireOnce(t, msgs)
}
