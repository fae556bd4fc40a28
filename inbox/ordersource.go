package inbox

import (
	"fmt"

	"github.com/oncekit/oncekit/broker"
)

// OrderedSource is the source ordered mode needs (Config.Ordered); see
// broker.OrderedSource.
type OrderedSource = broker.OrderedSource

// Scanned is one message as OrderedSource.Scan reads it; see broker.Scanned.
type Scanned = broker.Scanned

// SequencedDelivery is a Delivery that knows its position in the log; see
// broker.SequencedDelivery.
type SequencedDelivery = broker.SequencedDelivery

// ErrOrderUnsupported is returned by NewConsumer for Config.Ordered with a
// Source that does not implement OrderedSource: per-key order could not
// be kept across processes and crashes. It wraps ErrInvalidConfig.
var ErrOrderUnsupported = fmt.Errorf("%w: Ordered needs an OrderedSource (such as broker/natsjs.Source)", ErrInvalidConfig)
