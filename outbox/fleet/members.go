package fleet

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/internal/cfgerr"
)

// members is the fleet's membership: one entry per member in a JetStream
// key-value bucket, refreshed every MemberTTL/3, and a watch of the bucket
// that keeps the time of every member's last refresh.
//
// A member is live while its last refresh is at most a MemberTTL older
// than this member's own last refresh, both stamped by the server: what the
// bucket's TTL would keep at that moment, judged without any member's
// clock. The list is read once the watch has delivered this member's own
// last refresh, so it holds every refresh and leave written before it.
// Reading it sends nothing: a listing of the bucket is a consumer created
// and deleted through the cluster's metadata leader, which at thirty
// members refreshing every second cost the NATS cluster twice the CPU of
// the watch.
type members struct {
	kv   jetstream.KeyValue
	id   string
	key  string
	mine string // this member's group, the value of its entry
	ttl  time.Duration

	w     jetstream.KeyWatcher
	done  chan struct{} // closed once the watch's loop has returned
	moved chan struct{} // signalled at each entry the watch delivers

	mu    sync.Mutex
	at    map[string]time.Time // each member's last refresh (server time); a leave deletes it
	group map[string]string    // each member's group, from its entry
	rev   uint64               // the last revision the watch delivered
	own   uint64               // the revision of this member's last refresh

	// last is the previous list; lossSince is when lists began to find a
	// large part of last gone, zero while they do not (see list).
	last      []string
	lossSince time.Time
}

// errWatchBehind is list's error while the watch has not delivered this
// member's last refresh: the last list stays.
var errWatchBehind = errors.New("fleet: the members' watch is behind")

// joinBucket creates the bucket, or updates it to c's TTL (the members of
// a fleet must share MemberTTL: the last to start sets it), and watches
// it until close.
func joinBucket(ctx context.Context, js jetstream.JetStream, c *Config) (*members, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      c.Bucket,
		Description: "oncekit relay fleet members",
		TTL:         c.MemberTTL,
		History:     1,
		Replicas:    c.BucketReplicas,
	})
	if err != nil {
		return nil, fmt.Errorf("fleet: members bucket %q: %w", c.Bucket, err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("fleet: watch members bucket %q: %w", c.Bucket, err)
	}
	m := &members{kv: kv, id: c.ID, key: memberKey(c.ID), mine: c.Group, ttl: c.MemberTTL, w: w,
		done: make(chan struct{}), moved: make(chan struct{}, 1), at: map[string]time.Time{}, group: map[string]string{}}
	go m.watch()
	return m, nil
}

// watch keeps m.at from the watch's entries until close stops it.
func (m *members) watch() {
	defer close(m.done)
	for e := range m.w.Updates() {
		if e == nil {
			continue // the end of the initial values
		}
		b, err := base64.RawURLEncoding.DecodeString(e.Key())
		m.mu.Lock()
		m.rev = max(m.rev, e.Revision())
		switch {
		case err != nil || cfgerr.NotID(string(b)) != "":
			// Not a member's key: written to the bucket by something
			// else, it names no member (a member's ID passed the
			// same check).
		case e.Operation() == jetstream.KeyValuePut:
			m.at[string(b)] = e.Created()
			m.group[string(b)] = entryGroup(string(b), e.Value())
		default: // deleted, purged, or expired with a marker
			delete(m.at, string(b))
			delete(m.group, string(b))
		}
		m.mu.Unlock()
		select {
		case m.moved <- struct{}{}:
		default:
		}
	}
}

// close stops the watch and waits for its loop.
func (m *members) close() {
	_ = m.w.Stop()
	<-m.done
}

// memberKey is id as a key-value key (any bytes: base64url, no padding).
func memberKey(id string) string { return base64.RawURLEncoding.EncodeToString([]byte(id)) }

// entryGroup is the group an entry of member id names: its value, or id
// when the value is not an ID (written by something else, or empty), so
// that such a member is a group of its own.
func entryGroup(id string, value []byte) string {
	if g := string(value); g != "" && cfgerr.NotID(g) == "" {
		return g
	}
	return id
}

// refresh writes this member's entry, its group, restarting its TTL.
func (m *members) refresh(ctx context.Context) error {
	rev, err := m.kv.Put(ctx, m.key, []byte(m.mine))
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.own = max(m.own, rev)
	m.mu.Unlock()
	return nil
}

// spread returns the members of ids with their groups, as last seen; a
// member whose entry the watch has not delivered is a group of its own.
func (m *members) spread(ids []string) []Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Member, len(ids))
	for i, id := range ids {
		out[i] = Member{ID: id, Group: cmp.Or(m.group[id], id)}
	}
	return out
}

// leave deletes this member's entry, so that the others reassign its
// databases at their next look rather than after the TTL.
func (m *members) leave(ctx context.Context) error {
	return m.kv.Purge(ctx, m.key)
}

// list returns the live members' IDs, sorted, this member included, as of
// this member's last refresh. It waits up to a third of MemberTTL for the
// watch to deliver that refresh (errWatchBehind).
func (m *members) list(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, m.ttl/3)
	defer cancel()
	for {
		m.mu.Lock()
		caught := m.own > 0 && m.rev >= m.own
		m.mu.Unlock()
		if caught {
			break
		}
		select {
		case <-m.moved:
		case <-ctx.Done():
			return nil, errWatchBehind
		}
	}
	m.mu.Lock()
	ids := []string{m.id}
	if now, ok := m.at[m.id]; ok {
		for id, at := range m.at {
			switch age := now.Sub(at); {
			case age > 2*m.ttl:
				delete(m.at, id) // long gone: forgotten
				delete(m.group, id)
			case age <= m.ttl && id != m.id:
				ids = append(ids, id)
			}
		}
	}
	m.mu.Unlock()
	slices.Sort(ids)
	// A look that finds more than a quarter of the last list gone at once
	// is believed only once the loss has lasted a MemberTTL: a NATS node
	// that has just restarted can serve the watch before it has caught up,
	// and a member that believed it would start relays for nearly every
	// database, far over their connection budget (seen in make
	// chaos-fleet). A real departure of that many moves their databases a
	// MemberTTL later; one of fewer, at once. Only the duration is
	// measured here, so a member's clock does not matter.
	if lost := len(m.last) - len(ids); lost >= 2 && 4*lost > len(m.last) {
		now := time.Now()
		if m.lossSince.IsZero() {
			m.lossSince = now
		}
		if now.Sub(m.lossSince) < m.ttl {
			return slices.Clone(m.last), nil
		}
	}
	m.lossSince = time.Time{}
	m.last = ids
	return slices.Clone(ids), nil
}
