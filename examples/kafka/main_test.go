package main

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/oncekit/oncekit/internal/testkit/leaktest"
)

// Goroutines of sarama's dependencies that outlive its Close on their own
// schedule: its metrics (rcrowley/go-metrics) tick every meter from one
// goroutine of the process, never ended; a producer's circuit breaker
// (opened by a topic it cannot find) sleeps out its 10 s before it ends.
var sarama = []goleak.Option{
	goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"),
	goleak.IgnoreAnyFunction("github.com/eapache/go-resiliency/breaker.(*Breaker).timer"),
}

func TestMain(m *testing.M) { leaktest.Main(m, append(sarama, leaktest.WatermillMultiplier...)...) }
