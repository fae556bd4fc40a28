package aspubsub_test

import (
	"testing"

	"github.com/oncekit/oncekit/internal/testkit/leaktest"
)

func TestMain(m *testing.M) { leaktest.Main(m, leaktest.WatermillMultiplier...) }
