package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// Through PgBouncer in transaction pooling mode, with pgx describing
// nothing (exec) or caching descriptions (cache_describe), the consumer
// claims, applies and settles every message once, one at a time and in
// batches, ordered or not, and dead-letters a poison message (its headers
// a jsonb argument).
func TestConsumesThroughPgBouncer(t *testing.T) {
	t.Parallel()
	for _, mode := range testenv.PooledModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			url := testenv.PooledURL(t, mode)
			for _, tc := range []struct {
				name    string
				batch   int
				ordered bool
			}{{"single", 1, false}, {"batch", 20, false}, {"ordered", 20, true}} {
				t.Run(tc.name, func(t *testing.T) {
					b := setupOn(t, natsjs.StreamConfig{}, testenv.NewDBOn(t, url))
					msgs := make([]broker.Message, 100)
					for i := range msgs {
						msgs[i] = b.msg(fmt.Sprint("k", i%7), i)
					}
					poison := b.msg("poison", -1)
					poison.Headers = map[string]string{"X-Why": "poison"}
					b.publish(append(msgs, poison)...)
					cfg := b.config("c")
					cfg.BatchSize, cfg.Ordered = tc.batch, tc.ordered
					c := b.start(b.source("d", 5*time.Second), inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
						if m.ID == poison.ID {
							return inbox.Permanent(errors.New("poison"))
						}
						return insertEffect(ctx, tx, m)
					}), cfg)
					waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == 100 && s.DeadLettered == 1 })
					eff := b.effects()
					require.Len(t, eff, 100)
					for _, m := range msgs {
						require.Equal(t, 1, eff[m.ID])
					}
					require.Equal(t, 1, b.count(`SELECT count(*) FROM dead_letters WHERE consumer = 'c' AND headers->'X-Why'->>0 = 'poison'`))
				})
			}
		})
	}
}
