package outbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// BenchmarkEnqueueEpoch measures what the repartition barrier costs a
// writer: one-message transactions with Enqueue's INSERT (it reads
// outbox_epoch, under its ACCESS SHARE lock, and computes the partition)
// against the same transactions with the INSERT of before (the partition
// computed in Go from a count read once), interleaved on one schema so that
// both see the same load.
// Reports each one's mean time per transaction, with 8 concurrent writers.
func BenchmarkEnqueueEpoch(b *testing.B) {
	db := testenv.NewDB(b)
	const before = `INSERT INTO outbox (id, partition, ordering_key, subject, payload, headers)
SELECT m.id, m.partition, m.key, m.subject, m.payload, m.headers::jsonb
FROM unnest($1::uuid[], $2::int[], $3::text[], $4::text[], $5::bytea[], $6::text[])
	WITH ORDINALITY AS m(id, partition, key, subject, payload, headers, ord)
ORDER BY m.ord
ON CONFLICT (id) DO NOTHING
RETURNING id`
	// Enqueue's INSERT, run the same way.
	epoch := outbox.InsertSQL(db.Schema)
	ctx := context.Background()
	msg := func() broker.Message {
		return broker.Message{ID: uuid.New(), Subject: "bench.x", Key: uuid.NewString()[:8], Payload: []byte(`{"n":1}`)}
	}
	run := func(old bool) error {
		m := msg()
		return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			sql, part := before, any([]int32{int32(outbox.PartitionOf(m, 16))})
			if !old {
				sql, part = epoch, []int64{int64(outbox.PartitionHash(m))}
			}
			rows, err := tx.Query(ctx, sql, []uuid.UUID{m.ID}, part,
				[]string{m.Key}, []string{m.Subject}, [][]byte{m.Payload}, []*string{nil})
			if err != nil {
				return err
			}
			rows.Close()
			return rows.Err()
		})
	}
	var mu sync.Mutex
	var took [2]time.Duration
	var n [2]int
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range b.N {
				old := (i+w)%2 == 0
				t0 := time.Now()
				if err := run(old); err != nil {
					b.Error(err)
					return
				}
				k := 0
				if old {
					k = 1
				}
				mu.Lock()
				took[k] += time.Since(t0)
				n[k]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(took[0].Microseconds())/float64(max(n[0], 1)), "epoch-µs/tx")
	b.ReportMetric(float64(took[1].Microseconds())/float64(max(n[1], 1)), "before-µs/tx")
}
