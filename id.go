package oncekit

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	"github.com/google/uuid"
)

// domain separates oncekit's hashes from any other use of SHA-256 over the
// same parts. It is part of the stable contract: never change it.
const domain = "oncekit/v1"

// digest hashes the domain tag and each part, every one prefixed with its
// length as a big-endian uint64, so ("ab", "c") and ("a", "bc") differ.
func digest(kind byte, parts []string) [sha256.Size]byte {
	h := sha256.New()
	var n [8]byte
	write := func(s string) {
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	write(domain)
	h.Write([]byte{kind})
	binary.BigEndian.PutUint64(n[:], uint64(len(parts)))
	h.Write(n[:])
	for _, p := range parts {
		write(p)
	}
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// DeriveID returns a deterministic UUID (version 8, RFC 9562 variant) for the
// given parts. The same parts always give the same ID, across processes,
// machines and releases, which is what makes a replayed operation produce the
// same event ID and so a no-op insert. Typical use:
//
//	paymentID := oncekit.DeriveID(tenant, idempotencyKey)
//	eventID := oncekit.DeriveID(paymentID.String(), "PaymentCreated")
func DeriveID(parts ...string) uuid.UUID {
	d := digest('i', parts)
	var id uuid.UUID
	copy(id[:], d[:16])
	id[6] = (id[6] & 0x0f) | 0x80 // version 8: custom
	id[8] = (id[8] & 0x3f) | 0x80 // RFC 9562 variant
	return id
}

// DeriveKey returns a deterministic idempotency key for the given parts: 64
// lowercase hex characters (the full SHA-256), safe in HTTP headers and within
// every provider's key length limit we know of (Stripe allows 255).
func DeriveKey(parts ...string) string {
	d := digest('k', parts)
	return hex.EncodeToString(d[:])
}
