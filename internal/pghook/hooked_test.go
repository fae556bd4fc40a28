package pghook_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pghook"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// Hooked runs Before ahead of each statement, and a statement whose Before
// fails is not sent.
func TestHookedRunsBeforeEachStatement(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE hooked (n int)`)
	require.NoError(t, err)
	refuse := errors.New("refused")
	var calls int
	var fail bool
	q := pghook.Hooked{Q: db.Pool, Before: func(context.Context) error {
		calls++
		if fail {
			return refuse
		}
		return nil
	}}

	_, err = q.Exec(ctx, `INSERT INTO hooked VALUES (1)`)
	require.NoError(t, err)
	rows, err := q.Query(ctx, `SELECT n FROM hooked`)
	require.NoError(t, err)
	rows.Close()
	var n int
	require.NoError(t, q.QueryRow(ctx, `SELECT count(*) FROM hooked`).Scan(&n))
	require.Equal(t, 1, n)
	require.Equal(t, 3, calls)

	fail = true
	_, err = q.Exec(ctx, `INSERT INTO hooked VALUES (2)`)
	require.ErrorIs(t, err, refuse)
	_, err = q.Query(ctx, `SELECT n FROM hooked`)
	require.ErrorIs(t, err, refuse)
	require.ErrorIs(t, q.QueryRow(ctx, `SELECT 1`).Scan(&n), refuse)
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM hooked`).Scan(&n))
	require.Equal(t, 1, n, "the refused INSERT was not sent")
}
