package wait

import (
	"context"
	"fmt"
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

// Until calls check every interval until it returns nil or ctx ends; then
// it returns ctx's error wrapping the last error of check.
func Until(ctx context.Context, interval time.Duration, check func(context.Context) error) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// Closed reports whether ch is closed, without waiting: the check a loop
// makes between steps on a channel that is closed to say "done" or "stop".
func Closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Every calls step at once and then every interval until ctx ends: the
// loop of a background job (a retention pass, a refresh of gauges). A step
// that overruns the interval is followed by the next at once, not by a
// burst of the ticks missed.
func Every(ctx context.Context, interval time.Duration, step func(context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		step(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
