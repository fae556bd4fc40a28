package console_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/console"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/outbox/fleet"
)

// The fleet page shows a row per database of the fleet's list, read at each
// view: the backlog and leases of those that answer, and why the others are
// down (refusing, hanging past FleetTimeout), without a credential and
// without the hung one delaying the page beyond its timeout.
func TestFleetPageShowsEachDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := testenv.NewDB(t), testenv.NewDB(t)
	ob, err := outbox.New(&outbox.Config{Schema: a.Schema})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, a.Pool, func(tx pgx.Tx) error {
		_, err := ob.Enqueue(ctx, tx, broker.Message{ID: uuid.New(), Subject: "s", Key: "k", Payload: []byte("1")},
			broker.Message{ID: uuid.New(), Subject: "s", Key: "k", Payload: []byte("2")},
			broker.Message{ID: uuid.New(), Subject: "s", Key: "k", Payload: []byte("3")})
		return err
	}))
	_, err = b.Pool.Exec(ctx, `UPDATE relay_partitions SET owner = 'relay-x', token = 1, expires_at = now() + interval '1 minute'
		WHERE partition < 4`)
	require.NoError(t, err)

	list := []fleet.Database{{Name: "a", URL: a.URL, Schema: a.Schema}, {Name: "b", URL: b.URL, Schema: b.Schema}}
	con, err := console.New(a.Pool, &console.Config{Schema: a.Schema, FleetTimeout: 2 * time.Second,
		Fleet: func() ([]fleet.Database, error) { return list, nil }})
	require.NoError(t, err)
	srv := httptest.NewServer(con)
	t.Cleanup(srv.Close)

	p := get(t, srv.URL+"/fleet")
	require.Equal(t, http.StatusOK, p.status, p.body)
	require.Regexp(t, `<td>a</td><td>up</td><td>3</td><td>\d+s</td><td>0</td><td class="bad">0 of 16</td><td>0</td>`, p.body)
	require.Contains(t, p.body, `<td>b</td><td>up</td><td>0</td><td>-</td><td>0</td><td class="bad">4 of 16</td><td>1</td>`)
	require.Contains(t, get(t, srv.URL+"/").body, `href="/fleet"`, "the page is in the navigation")

	// The list is read at each view: databases added since, one refusing
	// connections and one that accepts and never answers, are shown down.
	list = append(list,
		fleet.Database{Name: "refused", URL: "postgres://relay:S3cret@" + testenv.FreeAddr(t) + "/x?sslmode=disable"},
		fleet.Database{Name: "hangs", URL: "postgres://relay:S3cret@" + testenv.StartBlackhole(t) + "/x?sslmode=disable"})
	start := time.Now()
	p = get(t, srv.URL+"/fleet")
	took := time.Since(start)
	require.Equal(t, http.StatusOK, p.status, p.body)
	require.Less(t, took, 8*time.Second, "the hung database is given up on after FleetTimeout")
	require.Contains(t, p.body, "2 down")
	require.Regexp(t, `<td>refused</td><td class="bad">down: unreachable: [^<]*refused`, p.body)
	require.Contains(t, p.body, `<td>hangs</td><td class="bad">down: no answer within 2s</td>`)
	require.Regexp(t, regexp.MustCompile(`<td>a</td><td>up</td><td>3</td>`), p.body, "the others are read all the same")
	require.NotContains(t, p.body, "S3cret")

	// A list that cannot be read is an error page, not an empty fleet.
	broken := console.Config{Schema: a.Schema, Fleet: func() ([]fleet.Database, error) {
		return nil, errors.New("fleet list unreadable")
	}}
	con, err = console.New(a.Pool, &broken)
	require.NoError(t, err)
	bsrv := httptest.NewServer(con)
	t.Cleanup(bsrv.Close)
	p = get(t, bsrv.URL+"/fleet")
	require.Equal(t, http.StatusServiceUnavailable, p.status)
	require.Contains(t, p.body, "fleet list unreadable")
}

// Without Fleet there is no fleet page, and no link to one.
func TestNoFleetPageWithoutAList(t *testing.T) {
	t.Parallel()
	srv, _, _ := server(t, console.Config{})
	require.Equal(t, http.StatusNotFound, get(t, srv.URL+"/fleet").status)
	require.NotContains(t, get(t, srv.URL+"/").body, `/fleet"`)
	_, err := console.New(testenv.NewDB(t).Pool, &console.Config{FleetTimeout: -time.Second})
	require.ErrorIs(t, err, console.ErrInvalidConfig)
}
