package fleet_test

import (
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox/fleet"
)

// A list naming a database that does not exist, one whose role the server
// refuses and one whose schema holds no migrations: each is backed off and
// counted as down on its own, and the healthy database beside them is
// served as usual, every event once.
func TestBadDatabasesAreBackedOffAndTheOthersServed(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	healthy := newOutboxDB(t, "healthy")
	with := func(edit func(u *url.URL)) string {
		u := must(url.Parse(healthy.def.URL))
		edit(u)
		return u.String()
	}
	nodb := fleet.Database{Name: "nodb", Schema: healthy.def.Schema,
		URL: with(func(u *url.URL) { u.Path = "/no_such_database_" + healthy.def.Schema })}
	badRole := fleet.Database{Name: "badrole", Schema: "badrole", // refused before its schema is read
		URL: with(func(u *url.URL) { u.User = url.UserPassword("no_such_role_"+healthy.def.Schema, "s3cret") })}
	noMigrations := fleet.Database{Name: "nomigrations", URL: healthy.def.URL, Schema: "nomigrations"}

	// The bad databases are refused at once, none waits out ConnectTimeout;
	// the healthy one's checks (a ping every MemberTTL/3) must not count a
	// loaded machine's slow round trip as a failure (one did at 1 s).
	cfg := w.config("m1")
	cfg.ConnectTimeout = 10 * time.Second
	m := w.start(t, cfg, healthy.def, nodb, badRole, noMigrations)
	first := w.enqueue(t, healthy, "h", 10)
	w.pub.waitPublished(t, first, 60*time.Second)
	metric := func(name, db string) float64 { return testenv.Metric(t, m.reg, name, "database", db) }
	require.Eventually(t, func() bool {
		for _, db := range []string{"nodb", "badrole", "nomigrations"} {
			if metric("oncekit_fleet_database_failures_total", db) < 2 || metric("oncekit_fleet_database_up", db) != 0 {
				return false
			}
		}
		return true
	}, 60*time.Second, 50*time.Millisecond, "each bad database retried and reported down")
	more := w.enqueue(t, healthy, "h", 10)
	w.pub.waitPublished(t, more, 60*time.Second)
	w.pub.requireOnce(t, append(first, more...))
	require.Equal(t, 1.0, metric("oncekit_fleet_database_up", "healthy"))
	require.Zero(t, metric("oncekit_fleet_database_failures_total", "healthy"))
}

// One outbox under two names, spelt two ways (a URL and keyword/value
// settings, another user), is refused with the list: two relays of one
// member on one database would share its leases under one relay ID.
func TestSetRefusesOneOutboxSpeltTwoWays(t *testing.T) {
	t.Parallel()
	n := testenv.NewNATS(t)
	f, err := fleet.New(n.JS, nopPublisher{}, nil)
	require.NoError(t, err)
	for _, other := range []string{
		"host=db.internal dbname=app user=other password=s3cret",
		"postgres://other:s3cret@db.internal:5432/app?sslmode=disable",
	} {
		err = f.Set([]fleet.Database{{Name: "a", URL: "postgres://app:s3cret@db.internal/app"}, {Name: "b", URL: other}})
		require.ErrorIs(t, err, fleet.ErrInvalidConfig)
		require.ErrorContains(t, err, `databases "a" and "b" are one outbox`)
		require.NotContains(t, err.Error(), "s3cret")
	}
	require.NoError(t, f.Set([]fleet.Database{{Name: "a", URL: "postgres://app@db.internal/app"},
		{Name: "b", URL: "postgres://app@db.internal/app2"}, {Name: "c", URL: "postgres://app@db.internal:5433/app"},
		{Name: "d", URL: "postgres://app@db.internal/app", Schema: "other"}}))
}
