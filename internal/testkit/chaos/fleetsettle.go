package chaos

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/internal/wait"
)

// The fleet run kills a process only once the fleet stands still: every
// process up, the members' bucket holding exactly their entries, and every
// lease unmoved for a lease. A kill made while a restarted process's
// members still join is two changes at once: the lists flap between the
// two (24, 30, 24, 30 members in one run), each change moves databases,
// and what the kill's re-ownership measures is no longer its own death.

// standMembers waits until the members' bucket holds exactly perProc
// entries of each process in procs, all of its running instance, and has
// for a MemberTTL, or 10 MemberTTLs: by then every member has acted on that
// list (a list is acted on once it has stood for a look). It returns what
// still differed when it gave up.
func standMembers(ctx context.Context, kv jetstream.KeyValue, sup *Supervisor, procs []string, perProc int) error {
	ctx, cancel := context.WithTimeout(ctx, 10*fleetMemberTTL)
	defer cancel()
	var last []string
	stableSince := time.Now()
	return wait.Until(ctx, 250*time.Millisecond, func(ctx context.Context) error {
		ids, err := memberIDs(ctx, kv)
		if err != nil {
			return err
		}
		// Each process's entries, by the instance (its pid) that wrote them.
		for _, p := range procs {
			pid := sup.PID(p)
			if pid == 0 {
				return fmt.Errorf("%s is not up", p)
			}
			n, mine := 0, fmt.Sprintf("%s-%d-", p, pid)
			for _, id := range ids {
				switch {
				case strings.HasPrefix(id, mine):
					n++
				case strings.HasPrefix(id, p+"-"):
					return fmt.Errorf("%s: an entry of a former instance: %s", p, id)
				}
			}
			if n != perProc {
				return fmt.Errorf("%s: %d of %d members in the bucket", p, n, perProc)
			}
		}
		if !slices.Equal(ids, last) {
			last, stableSince = ids, time.Now()
		}
		if time.Since(stableSince) < fleetMemberTTL {
			return errors.New("members still changing")
		}
		return nil
	})
}

// fleetBucket opens the members' bucket the run's members write.
func fleetBucket(ctx context.Context, nc *nats.Conn) (jetstream.KeyValue, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, fleetBucketName)
	if err != nil {
		return nil, fmt.Errorf("the members' bucket: %w", err)
	}
	return kv, nil
}

// memberIDs lists the IDs of the entries in the members' bucket, sorted.
func memberIDs(ctx context.Context, kv jetstream.KeyValue) ([]string, error) {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	keys, err := kv.Keys(lctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(keys))
	for _, k := range keys {
		b, err := base64.RawURLEncoding.DecodeString(k)
		if err != nil {
			return nil, fmt.Errorf("a key no member wrote: %q", k)
		}
		ids = append(ids, string(b))
	}
	slices.Sort(ids)
	return ids, nil
}

// settleLeases waits until every database of dbs has k relays, every
// partition is owned and no owner changed for a lease, or 4 leases; it
// returns what still moved when it gave up. The relays are counted too: a
// member that serves a database it is no longer assigned to, or not yet,
// may hold no partition there but holds connections.
func settleLeases(ctx context.Context, dbs []*fleetDB) error {
	ctx, cancel := context.WithTimeout(ctx, 4*fleetLease)
	defer cancel()
	var last map[string]map[int]string
	stableSince := time.Now()
	return wait.Until(ctx, 250*time.Millisecond, func(ctx context.Context) error {
		now := map[string]map[int]string{}
		for _, d := range dbs {
			o, err := d.owners(ctx)
			if err != nil {
				return err
			}
			for p, owner := range o {
				if owner == "" {
					return fmt.Errorf("%s: partition %d unowned", d.name, p)
				}
			}
			switch n, err := d.relays(ctx); {
			case err != nil:
				return err
			case n != fleetReplicas:
				return fmt.Errorf("%s: %d relays", d.name, n)
			}
			now[d.name] = o
		}
		if !maps.EqualFunc(now, last, maps.Equal) {
			last, stableSince = now, time.Now()
		}
		if time.Since(stableSince) < fleetLease {
			return errors.New("leases still moving")
		}
		return nil
	})
}
