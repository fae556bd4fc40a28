package inbox

import (
	"fmt"
)

// ErrOrderUnsupported is returned by NewConsumer for Config.Ordered with a
// Source that does not implement OrderedSource: per-key order could not
// be kept across processes and crashes. It wraps ErrInvalidConfig.
var ErrOrderUnsupported = fmt.Errorf("%w: Ordered needs an broker.OrderedSource (such as broker/natsjs.Source)", ErrInvalidConfig)
