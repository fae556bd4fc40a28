package fleet

import (
	"context"
	"encoding/base64"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"
)

// members is the fleet's membership: one entry per member in a JetStream
// key-value bucket whose TTL (the server's clock) removes the entries of
// members that stopped refreshing them.
type members struct {
	kv  jetstream.KeyValue
	id  string
	key string
}

// joinBucket creates the bucket, or updates it to c's TTL: the members of
// a fleet must share MemberTTL (the last to start sets it).
func joinBucket(ctx context.Context, js jetstream.JetStream, c *Config) (*members, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      c.Bucket,
		Description: "oncekit relay fleet members",
		TTL:         c.MemberTTL,
		History:     1,
	})
	if err != nil {
		return nil, fmt.Errorf("fleet: members bucket %q: %w", c.Bucket, err)
	}
	return &members{kv: kv, id: c.ID, key: memberKey(c.ID)}, nil
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
	slices.Sort(ids)
	return ids, nil
}
