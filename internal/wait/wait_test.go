package wait

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestSleepElapses(t *testing.T) {
	t.Parallel()
	start := time.Now()
	assert.True(t, Sleep(context.Background(), 20*time.Millisecond))
	assert.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond)
}

func TestSleepEndsWithTheContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	assert.False(t, Sleep(ctx, time.Hour))
	assert.Less(t, time.Since(start), 10*time.Second)
}
