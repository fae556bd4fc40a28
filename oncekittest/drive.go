package oncekittest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/wait"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/sideeffect"
)

// Timeout bounds every wait of this package.
const Timeout = time.Minute

// pollEvery is how often a wait looks again.
const pollEvery = 10 * time.Millisecond

// Start runs run (the Run method of a Relay, Consumer or Dispatcher) in the
// background until stop is called or the test ends. stop cancels run's
// context and waits for it to return; an error other than that cancellation
// fails the test. stop may be called more than once.
func Start(tb testing.TB, run func(context.Context) error) (stop func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			tb.Errorf("oncekittest: Run returned: %v", err)
		}
	})
	tb.Cleanup(stop)
	return stop
}

// DrainRelay runs r until ob's outbox holds no unpublished message (parked
// ones aside), then stops it.
func DrainRelay(ctx context.Context, tb testing.TB, r *outbox.Relay, db oncekit.Querier, ob *outbox.Outbox) {
	tb.Helper()
	defer Start(tb, r.Run)()
	until(ctx, tb, "the outbox to be published", func(ctx context.Context) (bool, string, error) {
		b, err := ob.Backlog(ctx, db)
		return b.Pending == 0, fmt.Sprintf("%d unpublished", b.Pending), err
	})
}

// DrainConsumer runs c, on whatever broker its source reads, until it has
// settled deliveries deliveries (each processed, acknowledged as a
// duplicate, dead-lettered or terminated; a delivery retried later counts
// when it settles), then stops it, which finishes and acks what is in hand,
// and returns c's counts.
func DrainConsumer(ctx context.Context, tb testing.TB, c *inbox.Consumer, deliveries int) inbox.Stats {
	tb.Helper()
	stop := Start(tb, c.Run)
	until(ctx, tb, fmt.Sprintf("the consumer to settle %d deliveries", deliveries), func(context.Context) (bool, string, error) {
		s := c.Stats()
		settled := s.Processed + s.Duplicates + s.DeadLettered + s.Terminated
		return settled >= int64(deliveries), fmt.Sprintf("%d settled (%+v)", settled, s), nil
	})
	stop()
	return c.Stats()
}

// DrainDispatcher runs d until no effect of l's ledger is fired and none is
// pending and due, then stops it. An effect waiting for a later retry (after
// an indefinite error) is left pending.
func DrainDispatcher(ctx context.Context, tb testing.TB, d *sideeffect.Dispatcher, db oncekit.Querier, l *sideeffect.Ledger) {
	tb.Helper()
	defer Start(tb, d.Run)()
	until(ctx, tb, "the dispatcher to settle every due effect", func(ctx context.Context) (bool, string, error) {
		busy := 0
		// Pending first: an effect goes pending → fired → confirmed, so one
		// claimed between the two reads is seen as pending by the first or
		// as fired by the second (read the other way round, it was missed
		// by both, and the dispatcher stopped under its call).
		for _, state := range []sideeffect.State{sideeffect.StatePending, sideeffect.StateFired} {
			rows, err := effects(ctx, db, l, sideeffect.Filter{State: state})
			if err != nil {
				return false, "", err
			}
			for _, r := range rows {
				if r.State == sideeffect.StateFired || (r.NextAttemptAt != nil && !r.NextAttemptAt.After(time.Now())) {
					busy++
				}
			}
		}
		return busy == 0, fmt.Sprintf("%d fired or due", busy), nil
	})
}

// until polls cond until it reports done, failing tb with what it waited
// for and cond's last status after Timeout, or at once on an error.
func until(ctx context.Context, tb testing.TB, what string, cond func(context.Context) (done bool, status string, err error)) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	var failed error
	err := wait.Until(ctx, pollEvery, func(ctx context.Context) error {
		done, status, err := cond(ctx)
		switch {
		case err != nil:
			failed = err
			cancel() // no use waiting longer
			return err
		case !done:
			return errors.New(status)
		}
		return nil
	})
	switch {
	case failed != nil:
		tb.Fatalf("oncekittest: waiting for %s: %v", what, failed)
	case err != nil:
		tb.Fatalf("oncekittest: gave up waiting for %s after %s: %v", what, Timeout, err)
	}
}
