package main

import (
	"testing"

	"github.com/oncekit/oncekit/internal/testkit/leaktest"
)

// The DLQ replay tests read from Redis streams through
// watermill-redisstream's subscriber.
func TestMain(m *testing.M) { leaktest.Main(m, leaktest.RedisStreamReader) }
