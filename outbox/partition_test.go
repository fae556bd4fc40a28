package outbox

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
)

func TestPartitionIsStable(t *testing.T) {
	t.Parallel()
	id := uuid.MustParse("0b7e6a3c-1f2d-4c5b-9a8e-7d6c5b4a3f21")
	// Pinned: changing the hash would move keys between partitions and break
	// per-key order across a deploy.
	require.Equal(t, 13, partitionOf(broker.Message{Key: "order-1"}, 16))
	require.Equal(t, partitionOf(broker.Message{Key: "order-1", ID: uuid.New()}, 16), partitionOf(broker.Message{Key: "order-1", ID: id}, 16))
	counts := make([]int, 16)
	for range 16000 {
		counts[partitionOf(broker.Message{ID: uuid.New()}, 16)]++
	}
	for p, n := range counts {
		require.Greater(t, n, 700, "partition %d", p)
	}
}
