package fleet_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox/fleet"
)

// hasSeries reports whether reg holds a sample of the metric family name
// with label database=db.
func hasSeries(t *testing.T, m *member, name, db string) bool {
	t.Helper()
	fams, err := m.reg.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "database" && l.GetValue() == db {
					return true
				}
			}
		}
	}
	return false
}

// Set adds a database to a running member, which publishes its events,
// and removes it, after which its events wait (and its series are gone)
// while the other database's keep flowing.
func TestSetAddsAndRemovesDatabasesWithoutRestart(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	a, b := newOutboxDB(t, "a"), newOutboxDB(t, "b")
	m := w.start(t, w.config("m1"), a.def)
	w.pub.waitPublished(t, w.enqueue(t, a, "x", 5), 60*time.Second)
	early := w.enqueue(t, b, "y", 5) // b is not in the set yet
	require.Zero(t, w.pub.published(early))

	require.NoError(t, m.f.Set([]fleet.Database{a.def, b.def}))
	w.pub.waitPublished(t, early, 60*time.Second)
	require.Eventually(t, func() bool { return hasSeries(t, m, "oncekit_outbox_published_total", "b") }, 5*time.Second, 20*time.Millisecond,
		"b's relay series, labelled")

	require.NoError(t, m.f.Set([]fleet.Database{a.def}))
	require.Eventually(t, func() bool {
		return len(m.f.Databases()) == 1 && !hasSeries(t, m, "oncekit_outbox_published_total", "b") &&
			!hasSeries(t, m, "oncekit_fleet_database_up", "b")
	}, 60*time.Second, 20*time.Millisecond, "b's relay stopped and its series gone")
	late := w.enqueue(t, b, "y", 5)
	w.pub.waitPublished(t, w.enqueue(t, a, "x", 5), 60*time.Second)
	require.Zero(t, w.pub.published(late), "b is no longer served")
	var leases int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM relay_partitions WHERE owner IS NOT NULL AND expires_at > now()`).Scan(&leases))
	require.Zero(t, leases, "b's leases given back")

	// A bad list is refused whole; the set in force stays.
	require.ErrorIs(t, m.f.Set([]fleet.Database{a.def, a.def}), fleet.ErrInvalidConfig)
	require.Equal(t, []string{"a"}, m.f.Databases())
}

func writeList(t *testing.T, path string, dbs ...fleet.Database) {
	t.Helper()
	b, err := json.Marshal(dbs)
	require.NoError(t, err)
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, b, 0o600))
	require.NoError(t, os.Rename(tmp, path))
}

// WatchFile follows the file operators edit: a database added there is
// served, a bad file is refused and the set in force stays, a database
// removed there stops being served.
func TestWatchFileReloads(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	a, b := newOutboxDB(t, "a"), newOutboxDB(t, "b")
	path := filepath.Join(t.TempDir(), "databases.json")
	writeList(t, path, a.def)
	dbs, err := fleet.ReadFile(path)
	require.NoError(t, err)
	var logs testenv.SyncBuffer
	cfg := w.config("m1")
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	m := w.start(t, cfg, dbs...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); m.f.WatchFile(ctx, path, 50*time.Millisecond) }()
	t.Cleanup(func() { cancel(); <-done })

	databases := func(want ...string) func() bool {
		return func() bool { return assertEqualNames(m.f.Databases(), want) }
	}
	require.Eventually(t, databases("a"), 60*time.Second, 20*time.Millisecond)
	writeList(t, path, a.def, b.def)
	require.Eventually(t, databases("a", "b"), 60*time.Second, 20*time.Millisecond)
	w.pub.waitPublished(t, w.enqueue(t, b, "y", 3), 60*time.Second)

	require.NoError(t, os.WriteFile(path, []byte(`[{"name":"a","url":""}]`), 0o600))
	_, err = fleet.ReadFile(path)
	require.ErrorIs(t, err, fleet.ErrInvalidConfig)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "database list refused") }, 60*time.Second, 20*time.Millisecond)
	require.NotContains(t, logs.String(), "postgres://", "no URL in the logs")
	require.Equal(t, []string{"a", "b"}, m.f.Databases(), "the set in force stays")
	writeList(t, path, b.def)
	require.Eventually(t, databases("b"), 60*time.Second, 20*time.Millisecond)
}

func assertEqualNames(got, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}
