package outbox

import (
	"context"
	"errors"
	"sort"
	"time"

	"github.com/oncekit/oncekit/internal/wait"
)

// leaseLoop heartbeats, renews the leases held, and moves towards a fair
// share (ceil(partitions / live relays)) by releasing extras and acquiring
// free or expired partitions. It returns when ctx ends.
func (r *Relay) leaseLoop(ctx context.Context) {
	every := r.cfg.Lease / 3
	for {
		r.epochRound(ctx)
		r.balance(ctx)
		r.checkPartitions(ctx)
		if !wait.Sleep(ctx, every) {
			return
		}
	}
}

// workerLease is the local view of one lease's validity: publishing stops at
// validUntil (on the relay's monotonic clock), a margin before the lease can
// expire in the database.
func (r *Relay) leaseDeadline(start time.Duration) time.Duration {
	return start + r.cfg.Lease - r.cfg.Lease/5
}

func (r *Relay) balance(ctx context.Context) {
	ttl := r.cfg.Lease.Seconds()
	start := r.since()
	var live int
	if err := r.pool.QueryRow(ctx, r.sql.heartbeat, r.cfg.ID, ttl).Scan(&live); err != nil {
		if ctx.Err() == nil {
			r.failed("heartbeat", err, "heartbeat failed")
		}
		return
	}
	r.watch.OK("heartbeat")

	// Renew what is held; anything not renewed under the same token is lost.
	held := r.heldPartitions()
	if len(held) > 0 {
		rows, err := r.pool.Query(ctx, r.sql.renew, r.cfg.ID, ttl, held)
		renewed := map[int]int64{}
		moved := false
		if err == nil {
			for rows.Next() {
				var p int
				var tok int64
				var ahead bool
				if err = rows.Scan(&p, &tok, &ahead); err != nil {
					break
				}
				renewed[p] = tok
				moved = moved || ahead
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
		if err != nil {
			if ctx.Err() == nil {
				r.failed("renew", err, "renewing leases failed")
			}
			return
		}
		r.watch.OK("renew")
		if moved {
			// Confirmed by a statement of its own: the renewal's snapshot
			// may predate a cursor move it waited for.
			switch err := r.checkMoved(ctx, held); {
			case errors.Is(err, ErrClusterMoved):
				r.stopMoved(err)
				return
			case err != nil:
				r.log.Warn("checking the cursors failed", "err", err)
			}
		}
		r.mu.Lock()
		for p, w := range r.workers {
			if tok, ok := renewed[p]; ok && tok == w.token {
				w.validUntil.Store(int64(r.leaseDeadline(start)))
				continue
			}
			r.log.Warn("lease lost", "partition", p)
			w.lost.Store(true)
			w.signalStop()
		}
		r.mu.Unlock()
	}

	share := (int(r.parts.Load()) + live - 1) / live
	r.mu.Lock()
	active := make([]int, 0, len(r.workers))
	for p, w := range r.workers {
		if !w.stopping() {
			active = append(active, p)
		}
	}
	r.mu.Unlock()
	sort.Ints(active)
	switch {
	case len(active) > share:
		for _, p := range active[share:] {
			r.releaseAfterBatch(ctx, p)
		}
	case len(active) < share && ctx.Err() == nil:
		r.acquire(ctx, share-len(active), start)
	}
	r.countOwned()
}

// countOwned sets the partitions_owned gauge to the partitions held now,
// those being given back aside, so that it follows the leases as they
// change rather than one round later.
func (r *Relay) countOwned() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m.setOwned(r.ownedLocked())
}

// ownedLocked counts the workers not stopping; r.mu is held.
func (r *Relay) ownedLocked() int {
	n := 0
	for _, w := range r.workers {
		if !w.stopping() {
			n++
		}
	}
	return n
}

// heldPartitions lists the partitions with a worker, stopping or not.
func (r *Relay) heldPartitions() []int32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	held := make([]int32, 0, len(r.workers))
	for p := range r.workers {
		held = append(held, int32(p))
	}
	return held
}

func (r *Relay) acquire(ctx context.Context, n int, start time.Duration) {
	rows, err := r.pool.Query(ctx, r.sql.acquire, r.cfg.ID, r.cfg.Lease.Seconds(), n, int(r.parts.Load()))
	if err != nil {
		r.failed("acquire", err, "acquiring partitions failed")
		return
	}
	type lease struct {
		p   int
		tok int64
	}
	var got []lease
	for rows.Next() {
		var l lease
		if err := rows.Scan(&l.p, &l.tok); err != nil {
			break
		}
		got = append(got, l)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		r.failed("acquire", err, "acquiring partitions failed")
		return
	}
	if len(got) > 0 {
		parts := make([]int32, len(got))
		for i, l := range got {
			parts[i] = int32(l.p)
		}
		if err := r.checkMoved(ctx, parts); err != nil {
			if _, rerr := r.pool.Exec(ctx, r.sql.release, r.cfg.ID, parts); rerr != nil {
				r.log.Warn("releasing leases failed; they expire on their own", "err", rerr)
			}
			if errors.Is(err, ErrClusterMoved) {
				r.stopMoved(err)
			} else {
				r.failed("acquire", err, "acquiring partitions failed")
			}
			return
		}
		// Healed only by partitions acquired and checked: with none free
		// the check that failed has not run again.
		r.watch.OK("acquire")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range got {
		if old, ok := r.workers[l.p]; ok {
			// A previous worker of this partition may still be finishing:
			// its token is stale, so its writes are fenced.
			old.signalStop()
		}
		w := newWorker(l.p, l.tok)
		w.validUntil.Store(int64(r.leaseDeadline(start)))
		r.workers[l.p] = w
		r.log.Info("partition acquired", "partition", l.p, "token", l.tok)
		go r.runWorker(context.WithoutCancel(ctx), w)
		w.poke()
	}
}

// releaseAfterBatch stops partition p's worker after its batch in flight and
// then gives the lease back.
func (r *Relay) releaseAfterBatch(ctx context.Context, p int) {
	r.mu.Lock()
	w := r.workers[p]
	r.mu.Unlock()
	if w == nil {
		return
	}
	w.signalStop()
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		<-w.done
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		r.mu.Lock()
		if r.workers[p] == w {
			delete(r.workers, p)
		}
		r.mu.Unlock()
		if _, err := r.pool.Exec(ctx, r.sql.release, r.cfg.ID, []int32{int32(p)}); err != nil {
			r.log.Warn("releasing a lease failed; it expires on its own", "partition", p, "err", err)
			return
		}
		r.log.Info("partition released", "partition", p)
	}()
}

// workerDone forgets w once it has stopped on its own (lease lost).
func (r *Relay) workerDone(w *worker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.workers[w.part] == w && w.lost.Load() {
		delete(r.workers, w.part)
	}
	r.m.setOwned(r.ownedLocked())
}

// checkPartitions reports rows that no relay will ever publish because
// their partition has no row in relay_partitions.
func (r *Relay) checkPartitions(ctx context.Context) {
	var beyond bool
	if err := r.pool.QueryRow(ctx, r.sql.partitionsBeyond, int(r.parts.Load())).Scan(&beyond); err != nil || !beyond {
		return
	}
	r.log.Error("the outbox holds rows in partitions beyond relay_partitions: rows were deleted from it by hand; run the migrations",
		"partitions", int(r.parts.Load()))
}
