package fleet_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/outbox/fleet"
)

// roundTrips is a TCP proxy to PostgreSQL that counts the round trips its
// clients start: Sync (extended protocol) and Query (simple protocol)
// messages.
type roundTrips struct {
	addr string
	n    atomic.Int64
}

func countRoundTrips(t *testing.T, upstream string) *roundTrips {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	rt := &roundTrips{addr: ln.Addr().String()}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
			go func() { rt.forward(c, up); _ = up.Close() }()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return rt
}

// forward copies the client's messages to up, counting round trips: the
// start-up message (length-prefixed, no type), then typed messages.
func (rt *roundTrips) forward(c, up net.Conn) {
	r := bufio.NewReader(c)
	var head [5]byte
	if _, err := io.ReadFull(r, head[:4]); err != nil {
		return
	}
	n := int64(binary.BigEndian.Uint32(head[:4]))
	if _, err := up.Write(head[:4]); err != nil || n < 4 {
		return
	}
	if _, err := io.CopyN(up, r, n-4); err != nil {
		return
	}
	for {
		if _, err := io.ReadFull(r, head[:]); err != nil {
			return
		}
		if head[0] == 'S' || head[0] == 'Q' {
			rt.n.Add(1)
		}
		n := int64(binary.BigEndian.Uint32(head[1:]))
		if _, err := up.Write(head[:]); err != nil || n < 4 {
			return
		}
		if _, err := io.CopyN(up, r, n-4); err != nil {
			return
		}
	}
}

// An idle database costs its member a probe and a sweep per PollInterval
// (the sweep names the partitions with retries come due, none here, so no
// worker is poked), and its lease, stats and fleet checks; and the
// connections they need. Not a round trip per partition held. Measured with
// the relay's default PollInterval and a longer one.
func TestIdleDatabaseCost(t *testing.T) {
	if testing.Short() {
		t.Skip("measures a 20s window")
	}
	testenv.RequireDirect(t, "counts the round trips of a direct connection")
	t.Parallel()
	for _, poll := range []time.Duration{500 * time.Millisecond, 2 * time.Second} {
		t.Run(poll.String(), func(t *testing.T) {
			t.Parallel()
			idleCost(t, poll)
		})
	}
}

func idleCost(t *testing.T, poll time.Duration) {
	w := newWorld(t)
	d := newOutboxDB(t, "idle")
	rt := countRoundTrips(t, must(url.Parse(d.db.URL)).Host)
	def := fleet.Database{Name: "idle", URL: through(t, d.db.URL, rt.addr), Schema: d.db.Schema}
	cfg := fleet.Config{ID: "m1", Bucket: w.name, ApplicationName: w.name, Logger: testLogger(),
		Relay: outbox.RelayConfig{PollInterval: poll}}
	m := w.start(t, cfg, def)
	owned := func() float64 {
		return testenv.Metric(t, m.reg, "oncekit_outbox_partitions_owned", "database", "idle")
	}
	require.Eventually(t, func() bool { return owned() == 16 }, 60*time.Second, 50*time.Millisecond)
	w.pub.waitPublished(t, w.enqueue(t, d, "k", 1), 60*time.Second) // past the first look

	const window = 20 * time.Second
	before := rt.n.Load()
	<-time.After(window) // the measurement window
	perSecond := float64(rt.n.Load()-before) / window.Seconds()
	var conns int
	require.NoError(t, d.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, w.name).Scan(&conns))
	t.Logf("idle database, 16 partitions held, PollInterval %v: %.1f round trips/s, %d connections open (budget %v)",
		poll, perSecond, conns, testenv.Metric(t, m.reg, "oncekit_fleet_database_connections_budget", "database", "idle"))
	require.Less(t, perSecond, 2.5*2/poll.Seconds()+3) // 16 workers poked per PollInterval would be 32/s more at 500ms
	require.LessOrEqual(t, conns, 5)
}
