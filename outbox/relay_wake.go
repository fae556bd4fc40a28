package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/internal/backoff"
	"github.com/oncekit/oncekit/internal/pgsql"
)

// Wake-up. The prober looks, in one cheap query, for partitions with rows
// that became readable since its previous look (txid between the previous and
// the current snapshot xmin) and pokes their workers. It looks again after
// BusyPollInterval while it finds work, doubling the wait on each empty look
// up to PollInterval. A notification (from writers with Config.Notify, or
// from Unpark) makes it look at once. Every PollInterval it also sweeps: one
// statement over the partitions it holds names those with work the probe
// does not see (rows a batch left after the cursor, retries come due,
// unparked rows), and only their workers are poked, so that an idle relay
// costs a round trip or two per PollInterval, not one per partition. A sweep
// that fails pokes every worker instead.

// notifyAll is the payload that pokes every worker (sent by Unpark).
const notifyAll = "all"

func (r *Relay) probeNow() {
	select {
	case r.probeCh <- struct{}{}:
	default:
	}
}

func (r *Relay) pokeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.workers {
		w.poke()
	}
}

func (r *Relay) probeLoop(ctx context.Context) {
	prev := "0"
	wait := r.cfg.BusyPollInterval
	lastAll := r.since()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-r.probeCh: // woken early; the Reset below drops the pending tick
		}
		if r.since()-lastAll >= r.cfg.PollInterval {
			lastAll = r.since()
			r.sweep(ctx)
		}
		found, waiting, xmin, err := r.probe(ctx, prev)
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			r.log.Warn("probe failed", "err", err)
			wait = r.cfg.PollInterval
		case found:
			prev = xmin
			wait = r.cfg.BusyPollInterval
		case waiting:
			prev = xmin
			wait = min(r.cfg.BusyPollInterval, waitingPoll)
		default:
			prev = xmin
			wait = min(max(2*wait, r.cfg.BusyPollInterval), r.cfg.PollInterval)
		}
		timer.Reset(wait)
	}
}

// sweep pokes the workers of the held partitions that have work the probe
// does not see; every worker when it cannot tell.
func (r *Relay) sweep(ctx context.Context) {
	held := r.heldPartitions()
	if len(held) == 0 {
		return
	}
	var parts []int32
	if err := r.pool.QueryRow(ctx, r.sql.sweep, held).Scan(&parts); err != nil {
		if ctx.Err() == nil {
			r.log.Warn("sweep failed; poking every partition", "err", err)
			r.pokeAll()
		}
		return
	}
	r.poke(parts)
}

// poke pokes the workers of parts that this relay runs.
func (r *Relay) poke(parts []int32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range parts {
		if w := r.workers[int(p)]; w != nil {
			w.poke()
		}
	}
}

// waitingPoll bounds the wait between looks while committed rows wait for
// an older transaction to end.
const waitingPoll = 5 * time.Millisecond

// probe pokes the workers of partitions with newly readable rows. waiting
// reports committed rows not yet readable.
func (r *Relay) probe(ctx context.Context, prev string) (found, waiting bool, xmin string, err error) {
	held := r.heldPartitions()
	if len(held) == 0 {
		return false, false, prev, nil
	}
	var parts []int32
	if err := r.pool.QueryRow(ctx, r.sql.probe, held, prev).Scan(&xmin, &parts, &waiting); err != nil {
		return false, false, prev, err
	}
	if len(parts) == 0 {
		return false, waiting, xmin, nil
	}
	r.poke(parts)
	return true, waiting, xmin, nil
}

// listens reports whether the relay LISTENs: unless PollOnly, when its
// pool's connections have backends of their own (pgsql.Direct). Through a
// pooler it polls, and says so once.
func (r *Relay) listens(ctx context.Context) (bool, error) {
	if r.cfg.PollOnly {
		return false, nil
	}
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("outbox: relay: %w", err)
	}
	defer conn.Release()
	direct, err := pgsql.Direct(ctx, conn.Conn())
	if err != nil {
		return false, fmt.Errorf("outbox: relay: %w", err)
	}
	if !direct {
		r.log.Info("not listening for notifications: the pool goes through a connection pooler, where LISTEN does not hold; polling instead",
			"poll_interval", r.cfg.PollInterval)
	}
	return direct, nil
}

// listenLoop holds a connection LISTENing on the outbox channel, reconnecting
// with backoff when it breaks.
func (r *Relay) listenLoop(ctx context.Context) {
	// listen returns only when its connection breaks, or ctx ends.
	_ = backoff.Retry(ctx, backoff.Policy{Min: 100 * time.Millisecond, Max: 10 * time.Second}, r.listen,
		func(err error, retry time.Duration) {
			r.log.Warn("LISTEN connection lost; polling meanwhile", "err", err, "retry_in", retry)
		})
}

func (r *Relay) listen(ctx context.Context) error {
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// The connection carries LISTEN state: never hand it back to the pool.
	defer func() { _ = conn.Hijack().Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, r.sql.listen); err != nil {
		return err
	}
	r.probeNow() // catch up on anything written while not listening
	for {
		n, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if n.Payload == notifyAll {
			r.pokeAll()
		}
		r.probeNow()
	}
}
