package inbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/inbox"
)

// A handler binding msg.ID to a uuid parameter on its transaction gets the
// direct encoding (RegisterUUID) without configuring the pool, single and
// batched: not pgx's driver.Valuer plan, a text round trip per value.
func TestHandlerTransactionEncodesMessageIDDirectly(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 20} {
		t.Run(fmt.Sprint("batch-", batch), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.publish(b.msg("", 1), b.msg("", 2), b.msg("", 3))
			plans := make(chan string, 3)
			h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
				plans <- fmt.Sprintf("%T", tx.Conn().TypeMap().PlanEncode(pgtype.UUIDOID, pgtype.BinaryFormatCode, msg.ID))
				return insertEffect(ctx, tx, msg)
			})
			cfg := b.config("c")
			cfg.BatchSize = batch
			c := b.start(b.source("d", time.Second), h, cfg)
			waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == 3 })
			for range 3 {
				require.NotContains(t, <-plans, "DriverValuer")
			}
			require.Len(t, b.effects(), 3)
		})
	}
}
