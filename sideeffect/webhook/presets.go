package webhook

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/textproto"

	"github.com/oncekit/oncekit/internal/cfgerr"
)

// KeyPreset says how a receiver expects the effect's idempotency key: the
// request header that carries it, the longest key the receiver accepts and
// the characters it takes. The key oncekit sends is the effect's key,
// oncekit.DeriveKey(SourceID, Kind): 64 lowercase hex characters, the same
// on every attempt, which fits every preset.
type KeyPreset struct {
	// Provider names the receiver, for errors.
	Provider string
	// Header carries the key, written as the provider documents it. Empty
	// sends the key only as webhook-id, which every request carries.
	Header string
	// MaxLen is the longest key, in bytes, the provider documents; 0 when
	// it documents none. A longer key fails the call with a *KeyError
	// (ErrKeyTooLong) before any request is sent, unless Shorten is set:
	// the receiver would refuse it, and cutting it short could make two
	// effects share a key.
	MaxLen int
	// Shorten sends a key longer than MaxLen in Header as the first MaxLen
	// characters of the unpadded base64url SHA-256 of the key (at most 43,
	// 6 bits each), the same on every attempt, instead of failing the call.
	// webhook-id still carries the whole key. Needs MaxLen of at least 22
	// (128 bits, so that two keys do not share a short form).
	Shorten bool
	// VisibleASCII restricts the key to visible ASCII, bytes 0x21 to 0x7E
	// (no spaces). Without it a key may hold any byte but the control
	// characters, and no leading or trailing space. A key outside the set
	// fails the call with a *KeyError (ErrKeyInvalid) before any request.
	VisibleASCII bool
}

// The presets of the receivers oncekit knows. Each one's header and length
// limit is the one its provider documents. None of them publishes a
// character set; their examples and recommended formats (UUIDs, random
// strings) are visible ASCII, the only keys a header carries intact
// everywhere, so the named presets take only those.
var (
	// DefaultKey sends Idempotency-Key (IETF httpapi draft) with no limit
	// of its own, besides webhook-id. It is the zero Config's.
	DefaultKey = KeyPreset{Provider: "default", Header: "Idempotency-Key"}
	// Stripe: Idempotency-Key, keys of up to 255 characters (Stripe
	// suggests V4 UUIDs or random strings with enough entropy).
	Stripe = KeyPreset{Provider: "Stripe", Header: "Idempotency-Key", MaxLen: 255, VisibleASCII: true}
	// PayPal: PayPal-Request-Id, a unique client-generated ID of 1 to 108
	// characters (the Orders v2 and Payments v2 references; PayPal's
	// examples are UUIDs).
	PayPal = KeyPreset{Provider: "PayPal", Header: "PayPal-Request-Id", MaxLen: 108, VisibleASCII: true}
	// Twilio: I-Twilio-Idempotency-Token, the header Twilio's own webhooks
	// carry for receivers to dedup on; Twilio documents it as a unique token
	// per event and states no format or length.
	Twilio = KeyPreset{Provider: "Twilio", Header: "I-Twilio-Idempotency-Token", VisibleASCII: true}
	// Adyen: Idempotency-Key (matched case-insensitively), a unique string
	// of at most 64 characters (Adyen recommends a V4 UUID).
	Adyen = KeyPreset{Provider: "Adyen", Header: "Idempotency-Key", MaxLen: 64, VisibleASCII: true}
	// StandardWebhooks: webhook-id alone, the message ID the Standard
	// Webhooks specification has receivers dedup on (the same on every
	// retry of a message; no length is set).
	StandardWebhooks = KeyPreset{Provider: "Standard Webhooks", Header: "", VisibleASCII: true}
)

// Errors a *KeyError wraps.
var (
	// ErrKeyTooLong: the key is longer than the preset's MaxLen.
	ErrKeyTooLong = errors.New("webhook: idempotency key longer than the provider accepts")
	// ErrKeyInvalid: the key is empty, or holds a byte the preset (or an
	// HTTP header) does not carry.
	ErrKeyInvalid = errors.New("webhook: idempotency key has characters the provider does not accept")
)

// minShortened is the shortest MaxLen Shorten accepts: 22 base64url
// characters, 132 bits of SHA-256.
const minShortened = 22

// KeyError is the definite error of a call whose idempotency key the
// receiver would refuse. It wraps ErrKeyTooLong or ErrKeyInvalid; nothing
// was sent.
type KeyError struct {
	// Provider is the preset's Provider.
	Provider string
	// Len is the key's length in bytes.
	Len int
	// MaxLen is the preset's MaxLen (0: none).
	MaxLen int
	// Offset is the position of the first refused byte, or -1 when the
	// length is the problem.
	Offset int
	err    error
}

// Error says what is wrong with the key, without the key.
func (e *KeyError) Error() string {
	switch {
	case e.err == ErrKeyTooLong:
		return fmt.Sprintf("%v: %s takes at most %d characters, the key has %d", e.err, e.Provider, e.MaxLen, e.Len)
	case e.Len == 0:
		return fmt.Sprintf("%v: %s: the key is empty", e.err, e.Provider)
	default:
		return fmt.Sprintf("%v: %s: byte %d of the key's %d", e.err, e.Provider, e.Offset, e.Len)
	}
}

// Unwrap returns ErrKeyTooLong or ErrKeyInvalid.
func (e *KeyError) Unwrap() error { return e.err }

// headerKey returns what the key header carries for key: the key itself,
// or its short form (Shorten). It fails with a *KeyError for a key the
// receiver would refuse.
func (k KeyPreset) headerKey(key string) (string, error) {
	if off := k.refusedByte(key); off >= 0 {
		return "", &KeyError{Provider: k.Provider, Len: len(key), MaxLen: k.MaxLen, Offset: off, err: ErrKeyInvalid}
	}
	if k.MaxLen == 0 || len(key) <= k.MaxLen {
		return key, nil
	}
	if !k.Shorten {
		return "", &KeyError{Provider: k.Provider, Len: len(key), MaxLen: k.MaxLen, Offset: -1, err: ErrKeyTooLong}
	}
	sum := sha256.Sum256([]byte(key))
	short := base64.RawURLEncoding.EncodeToString(sum[:])
	return short[:min(k.MaxLen, len(short))], nil
}

// refusedByte returns the offset of the first byte of key the preset does
// not take, 0 for an empty key, or -1.
func (k KeyPreset) refusedByte(key string) int {
	if key == "" {
		return 0
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch {
		case c < 0x20 || c == 0x7f: // control characters: no header carries them
			return i
		case k.VisibleASCII && (c == ' ' || c > 0x7e):
			return i
		case c == ' ' && (i == 0 || i == len(key)-1): // a receiver would trim it
			return i
		}
	}
	return -1
}

// keyHeader returns the header name the key goes in ("" for none besides
// webhook-id) and validates the preset.
func (k KeyPreset) keyHeader() (string, error) {
	if k.MaxLen < 0 {
		return "", cfgerr.New(ErrInvalidConfig, "webhook: Config.Key.MaxLen", "%d is negative", k.MaxLen)
	}
	if k.Shorten && k.MaxLen < minShortened {
		return "", cfgerr.New(ErrInvalidConfig, "webhook: Config.Key.Shorten",
			"needs MaxLen of at least %d (a shorter form could be shared by two keys), not %d", minShortened, k.MaxLen)
	}
	if k.Header == "" || k.Header == HeaderID {
		return "", nil
	}
	for _, c := range []byte(k.Header) {
		if !validHeaderByte(c) {
			return "", cfgerr.New(ErrInvalidConfig, "webhook: Config.Key.Header", "%q is not a valid header name", k.Header)
		}
	}
	if textproto.CanonicalMIMEHeaderKey(k.Header) == HeaderIdempotencyKey {
		return HeaderIdempotencyKey, nil
	}
	return k.Header, nil
}

// validHeaderByte reports whether c may appear in a header name (an RFC 9110
// token character).
func validHeaderByte(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}
