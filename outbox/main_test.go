package outbox_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/oncekit/oncekit/internal/testkit/leaktest"
)

func TestMain(m *testing.M) {
	leaktest.Main(m, goleak.Cleanup(func(code int) {
		stopLogicalCluster()
		os.Exit(code)
	}))
}
