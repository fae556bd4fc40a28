package oncekittest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/oncekittest"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/sideeffect"
)

// failures records what a helper reports instead of ending the test.
type failures struct {
	testing.TB
	msgs []string
}

func (f *failures) Helper() {}

func (f *failures) Fatalf(format string, args ...any) {
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
}

func TestRequireHelpersFailOnMissingRows(t *testing.T) {
	ctx := context.Background()
	db := oncekittest.NewDB(t)
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	ledger, err := sideeffect.New(&sideeffect.Config{Schema: db.Schema})
	require.NoError(t, err)

	f := &failures{TB: t}
	oncekittest.RequireEnqueued(ctx, f, db.Pool, ob, uuid.New())
	oncekittest.RequireEffect(ctx, f, db.Pool, ledger, "order-1", "email.receipt")
	require.Len(t, f.msgs, 2)
	require.Contains(t, f.msgs[0], "is not in the outbox")
	require.Contains(t, f.msgs[1], `no email.receipt effect for source "order-1"`)
}
