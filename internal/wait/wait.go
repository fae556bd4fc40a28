package wait

import (
	"context"
	"time"
)

// Sleep waits d or until ctx ends, whichever comes first, and reports
// whether the full wait elapsed (false: ctx ended).
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
