package outbox

import (
	"time"

	"github.com/oncekit/oncekit/internal/backoff"
)

// maxRestartWait caps the wait before the logical relay takes its lease or
// starts its stream again after either ended.
const maxRestartWait = 5 * time.Second

// restartBackoff is the wait before each new start of the lease or the
// stream: MinBackoff, doubling with each consecutive end, at most
// maxRestartWait.
func (r *LogicalRelay) restartBackoff() *backoff.Backoff {
	return backoff.Policy{Min: r.cfg.MinBackoff, Max: maxRestartWait}.Start()
}
