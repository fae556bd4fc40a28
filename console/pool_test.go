package console_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/console"
	"github.com/oncekit/oncekit/internal/testkit/consoletest"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// onlyPool is a pool with nothing but oncekit.Pool's methods, as a
// service's own wrapper (one that traces its statements, say) has.
type onlyPool struct{ oncekit.Pool }

// The console takes the narrow interface every other package takes, not
// *pgxpool.Pool: each page reads through a Pool that has nothing else.
func TestConsoleServesThroughAnyPool(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	consoletest.Seed(t, db)
	con, err := console.New(onlyPool{db.Pool}, &console.Config{Schema: db.Schema})
	require.NoError(t, err)
	srv := httptest.NewServer(con)
	t.Cleanup(srv.Close)
	for _, path := range []string{"/", "/outbox", "/inbox", "/effects", "/edge", "/audit"} {
		p := get(t, srv.URL+path)
		require.Equal(t, http.StatusOK, p.status, path+"\n"+p.body)
		require.NotContains(t, p.body, "could not read", path)
	}
}
