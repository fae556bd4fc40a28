package sqsbroker_test

import (
	"os"
	"testing"

	"github.com/oncekit/oncekit/examples/sqs/fauxqs"
)

func TestMain(m *testing.M) {
	code := m.Run()
	fauxqs.StopShared()
	os.Exit(code)
}
