package main

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/oncekit/oncekit/internal/leaktest"
)

// sarama's metrics (rcrowley/go-metrics) tick every meter from one
// goroutine of the process, started with the first meter and never ended.
var meterArbiter = goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick")

func TestMain(m *testing.M) { leaktest.Main(m, meterArbiter) }
