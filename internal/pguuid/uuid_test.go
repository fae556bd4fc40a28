package pguuid_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pguuid"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// Without the codec, pgx encodes a uuid.UUID through its driver.Valuer
// (text, a failed encode building an error, a parse, then binary); with it,
// the 16 bytes are appended.
// (Not parallel: AllocsPerRun counts the whole process's allocations.)
func TestRegisterUUIDEncodesDirectly(t *testing.T) {
	id := uuid.New()
	buf := make([]byte, 0, 64)
	var out []byte
	var err error
	encode := func(m *pgtype.Map) func() {
		return func() { out, err = m.Encode(pgtype.UUIDOID, pgtype.BinaryFormatCode, id, buf[:0]) }
	}
	plain := pgtype.NewMap()
	plainAllocs := testing.AllocsPerRun(100, encode(plain))
	require.NoError(t, err)
	require.Equal(t, id[:], out)

	m := pgtype.NewMap()
	pguuid.Register(m)
	pguuid.Register(m) // twice: a no-op
	// One allocation is left: boxing the UUID into Encode's any, which
	// every pgx argument pays.
	require.Equal(t, 1.0, testing.AllocsPerRun(100, encode(m)))
	require.Greater(t, plainAllocs, 5.0)
	require.NoError(t, err)
	require.Equal(t, id[:], out)

	text, err := m.Encode(pgtype.UUIDOID, pgtype.TextFormatCode, id, nil)
	require.NoError(t, err)
	require.Equal(t, id.String(), string(text))
	arr, err := m.Encode(pgtype.UUIDArrayOID, pgtype.BinaryFormatCode, []uuid.UUID{id, id}, nil)
	require.NoError(t, err)
	plainArr, err := plain.Encode(pgtype.UUIDArrayOID, pgtype.BinaryFormatCode, []uuid.UUID{id, id}, nil)
	require.NoError(t, err)
	require.Equal(t, plainArr, arr)
}

// On a real connection the values PostgreSQL stores are the same: a uuid
// column gets the UUID, a text column its canonical text, uuid[] its
// elements.
func TestRegisterUUIDStoresTheSameValues(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	pguuid.Register(conn.Conn().TypeMap())
	_, err = conn.Exec(ctx, `CREATE TABLE u (id uuid, txt text, ids uuid[])`)
	require.NoError(t, err)
	id := uuid.New()
	_, err = conn.Exec(ctx, `INSERT INTO u VALUES ($1, $2, $3)`, id, id, []uuid.UUID{id, uuid.Nil})
	require.NoError(t, err)
	var got, first uuid.UUID
	var txt string
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT id, txt, ids[1], cardinality(ids) FROM u`).Scan(&got, &txt, &first, &n))
	require.Equal(t, id, got)
	require.Equal(t, id.String(), txt)
	require.Equal(t, id, first)
	require.Equal(t, 2, n)
}
