package oncekit

import "time"

// The defaults every component's Config shares, each stated here once.
// The retention settings bound the loop a component that keeps rows runs
// (outbox.Relay, inbox.Consumer, sideeffect.Dispatcher, idempotency.Edge):
// every RetentionInterval, a pass deletes what is past retention,
// RetentionBatch rows per DELETE and at most RetentionRate rows per second,
// so that a large backlog (retention stopped for a while, or shortened)
// does not take the database's CPU and I/O from the hot paths.
const (
	// DefaultSchema holds oncekit's tables unless a Config names another.
	DefaultSchema = "oncekit"
	// DefaultRetentionInterval is the period of a retention loop.
	DefaultRetentionInterval = time.Minute
	// DefaultRetentionBatch is the most rows one retention DELETE removes.
	DefaultRetentionBatch = 1000
	// DefaultRetentionRate is the most rows a retention pass deletes per
	// second; a negative RetentionRate sets no limit.
	DefaultRetentionRate = 60_000
)
