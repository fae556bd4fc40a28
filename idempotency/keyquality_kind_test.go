package idempotency

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// keyKind tells the weak keys from random ones: e-mail addresses,
// timestamps, counters and short keys, and nothing for UUIDs and random
// base64 or hex.
func TestKeyKind(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ key, kind string }{
		{"alice@example.com", keyKindEmail},
		{"pay:alice.smith@mail.example.org:1", keyKindEmail},
		{"1732780800", keyKindTimestamp},
		{"1732780800123", keyKindTimestamp},
		{"order-1732780800", keyKindTimestamp},
		{"checkout_1732780800123_retry", keyKindTimestamp},
		{"2026-11-28T09:12:00Z", keyKindTimestamp},
		{"invoice-2026-11-28-0001", keyKindTimestamp},
		{"20450829-c4d1-4ce7-ad3d-0e5abc0d2fc9", ""}, // a UUID whose first group reads as a date
		{"42", keyKindCounter},
		{"000000123", keyKindCounter},
		{"order-42", keyKindCounter},
		{"payment_request_number_000123", keyKindCounter},
		{"abc", keyKindShort},
		{"k3Xq9v", keyKindShort},
		{"x", keyKindShort},
		{"ac9f1c2e-0b7d-4d1a-9a53-3f6e2b8c1d47", ""},
		{"01JDQ6ZK8V3M5T2XW9RB7HCNEF", ""},           // a ULID
		{"0193716e-7a40-7cc2-8f5d-2a1e9b3c4d5e", ""}, // a UUIDv7: its time is hex
		{"v2:payment:ac9f1c2e-0b7d-4d1a-9a53-3f6e2b8c1d47", ""},
		{"user@", keyKindShort},
		{"abcdefghijklmnopqrstu42", ""}, // no separator before the number
		{"@example.com", keyKindShort},
		{"a@b", keyKindShort},
		{"12345678901234567890", ""}, // 20 digits: no time, no small counter
	} {
		if got := keyKind(tc.key); got != tc.kind {
			t.Errorf("keyKind(%q) = %q, want %q", tc.key, got, tc.kind)
		}
	}
	// Random keys of the usual shapes are counted as none.
	misses := 0
	for range 20000 {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		for _, key := range []string{uuid.NewString(), base64.RawURLEncoding.EncodeToString(b), hex.EncodeToString(b)} {
			if kind := keyKind(key); kind != "" {
				misses++
				t.Logf("random key %q taken for %s", key, kind)
			}
		}
	}
	if misses > 0 {
		t.Errorf("%d of 60000 random keys taken for weak ones", misses)
	}
}

// keyKind allocates nothing, whatever the key.
func TestKeyKindAllocatesNothing(t *testing.T) {
	keys := []string{uuid.NewString(), "alice@example.com", "order-1732780800", "order-42", "abc", strings.Repeat("k", MaxKeyLen)}
	if n := testing.AllocsPerRun(100, func() {
		for _, k := range keys {
			_ = keyKind(k)
		}
	}); n != 0 {
		t.Fatalf("keyKind allocates %v times", n)
	}
}

func BenchmarkKeyKind(b *testing.B) {
	key := uuid.NewString()
	for b.Loop() {
		_ = keyKind(key)
	}
}
