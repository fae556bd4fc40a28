// Package leaktest fails a package's tests when a goroutine outlives them:
// every test package's TestMain calls Main. It wraps go.uber.org/goleak.
package leaktest

import (
	"testing"

	"go.uber.org/goleak"
)

// Main runs m's tests, then fails the binary if goroutines other than the
// runtime's remain. also names more goroutines to ignore, each a
// dependency's that outlives its Close on its own schedule.
func Main(m *testing.M, also ...goleak.Option) {
	goleak.VerifyTestMain(m, append(also, ignored...)...)
}

// ignored are goroutines that belong to the test's process rather than to
// a test, each named by the function of a named package that runs it: a
// goroutine blocked in a network read (internal/poll.runtime_pollWait) is
// not ignored for that alone, since a connection a test forgot to close
// waits there too.
var ignored = []goleak.Option{
	// net/http keeps idle keep-alive connections of the default transport
	// until they time out; their reader waits in a read, their writer in a
	// select.
	goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
	goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
}

// RedisStreamReader ignores watermill-redisstream's reader, which sleeps
// 500 ms after the read error that its Subscriber's Close causes before it
// sees it is closing: longer than goleak waits.
var RedisStreamReader = goleak.IgnoreAnyFunction("github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream.(*Subscriber).read")

// WatermillMultiplier ignores the goroutines of watermill's test suite
// (pubsub/tests) that fan many subscribers into one unbuffered channel: once
// the test has read the messages it counts, a forwarder holding one more
// (a redelivery) waits to hand it over for ever, and the goroutine that
// closes the channel waits for that forwarder. The suite never drains the
// channel, whatever the subscriber under test does.
var WatermillMultiplier = []goleak.Option{
	goleak.IgnoreAnyFunction("github.com/ThreeDotsLabs/watermill/internal/subscriber.(*multiplier).Subscribe.func2"),
	goleak.IgnoreAnyFunction("github.com/ThreeDotsLabs/watermill/internal/subscriber.(*multiplier).Subscribe.func3"),
}
