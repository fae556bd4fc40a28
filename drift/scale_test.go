package drift_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/drift"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// An expectation over a large table stays linear: 95,000 sources with one
// effect each, one missing and one doubled under another source ID. A plan
// that looked each effect's source up by a correlated subquery (quadratic)
// took 527 s here (EXPLAIN ANALYZE); the join takes under half a second,
// well under the bound given here.
func TestExpectationOverManyRowsIsLinear(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	exec(t, db, `CREATE TABLE payments (id text PRIMARY KEY)`)
	exec(t, db, `INSERT INTO payments SELECT 'p' || g FROM generate_series(1, 95000) g`)
	exec(t, db, `INSERT INTO side_effects (source_id, kind, idempotency_key, state, payload)
		SELECT 'p' || g, 'capture', 'k' || g, 'confirmed', convert_to('{"payment_id":"p' || g || '"}', 'UTF8')
		FROM generate_series(2, 95000) g`)
	exec(t, db, `INSERT INTO side_effects (source_id, kind, idempotency_key, state, payload)
		VALUES ('retry-of-p7', 'capture', 'kx', 'confirmed', convert_to('{"payment_id":"p7"}', 'UTF8'))`)
	exec(t, db, `ANALYZE`)

	for _, rule := range []drift.Rule{
		drift.ExpectEffects("by_source", "capture", `SELECT id FROM payments`),
		{Name: "by_payload", Expect: &drift.Expectation{Kind: "capture", SourcesSQL: `SELECT id FROM payments`, BusinessID: "$.payment_id"}},
	} {
		c, err := drift.New(db.Pool, &drift.Config{Schema: db.Schema, CheckTimeout: 20 * time.Second, Rules: []drift.Rule{rule}})
		require.NoError(t, err)
		rep, err := c.Run(context.Background())
		require.NoError(t, err)
		require.False(t, rep.Failed(), "%s: %+v", rule.Name, rep.Findings)
		require.True(t, rep.Drifted(), rule.Name)
	}
}
