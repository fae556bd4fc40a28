package fleet

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// members is the fleet's membership: one entry per member in a JetStream
// key-value bucket whose TTL (the server's clock) removes the entries of
// members that stopped refreshing them.
type members struct {
	kv  jetstream.KeyValue
	id  string
	key string
	// last is the previous list. A listing that races with members'
	// refreshes can miss a key being rewritten (its old entry deleted, the
	// new one past the lister's end), or return it twice: a member of last
	// that a list misses is looked up by its key before it counts as gone,
	// and a list holds each member once.
	last []string
	// ttl is the members' TTL; lossSince is when looks began to find a
	// large part of last gone, zero while they do not (see list).
	ttl       time.Duration
	lossSince time.Time
}

// joinBucket creates the bucket, or updates it to c's TTL: the members of
// a fleet must share MemberTTL (the last to start sets it).
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
	return &members{kv: kv, id: c.ID, key: memberKey(c.ID), ttl: c.MemberTTL}, nil
}

// memberKey is id as a key-value key (any bytes: base64url, no padding).
func memberKey(id string) string { return base64.RawURLEncoding.EncodeToString([]byte(id)) }

// refresh writes this member's entry, restarting its TTL.
func (m *members) refresh(ctx context.Context) error {
	_, err := m.kv.Put(ctx, m.key, []byte(m.id))
	return err
}

// leave deletes this member's entry, so that the others reassign its
// databases at their next look rather than after the TTL.
func (m *members) leave(ctx context.Context) error {
	return m.kv.Purge(ctx, m.key)
}

// list returns the live members' IDs, sorted, this member included.
func (m *members) list(ctx context.Context) ([]string, error) {
	lister, err := m.kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	ids := []string{m.id}
	for k := range lister.Keys() {
		b, err := base64.RawURLEncoding.DecodeString(k)
		if err != nil || string(b) == m.id {
			continue // not a member's key, or this member
		}
		ids = append(ids, string(b))
	}
	for _, id := range m.last {
		if slices.Contains(ids, id) {
			continue
		}
		switch _, err := m.kv.Get(ctx, memberKey(id)); {
		case err == nil:
			ids = append(ids, id) // refreshed while the list was read
		case !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, jetstream.ErrKeyDeleted):
			return nil, err
		}
	}
	// The listing also repeats a key rewritten while it was read.
	slices.Sort(ids)
	ids = slices.Compact(ids)
	// A look that finds more than a quarter of the last list gone at once
	// is believed only once the loss has lasted a MemberTTL: for a second
	// or two after a NATS node restarts, its replica of the bucket answers
	// lists and gets before it has caught up (30 members listed as 1, then
	// 5, 12, 19), and a member that believed it would start relays for
	// nearly every database, far over their connection budget (seen in
	// make chaos-fleet). A real departure of that many moves their
	// databases a MemberTTL later; one of fewer, at once. Only the
	// duration is measured here, so a member's clock does not matter.
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
