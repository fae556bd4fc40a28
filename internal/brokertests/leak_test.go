package brokertests_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/oncekit/oncekit/internal/leaktest"
)

func TestMain(m *testing.M) {
	// watermill-redisstream's reader sleeps 500 ms after the read error
	// that its Close causes before it sees its context ended.
	leaktest.Main(m, goleak.IgnoreAnyFunction("github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream.(*Subscriber).read"))
}
