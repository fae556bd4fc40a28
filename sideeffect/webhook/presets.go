package webhook

import (
	"errors"
	"net/textproto"

	"github.com/oncekit/oncekit/internal/cfgerr"
)

// KeyPreset says how a receiver expects the effect's idempotency key: the
// request header that carries it and the longest key the receiver accepts.
// The key oncekit sends is the effect's key (sideeffect.DeriveKey: 64
// lowercase hex characters unless the effect set its own), the same on
// every attempt; it fits every preset's limit.
type KeyPreset struct {
	// Provider names the receiver, for errors.
	Provider string
	// Header carries the key, written as the provider documents it. Empty
	// sends the key only as webhook-id, which every request carries.
	Header string
	// MaxLen is the longest key the provider documents; 0 when it documents
	// none. A longer key fails the call as a definite error before any
	// request is sent: the receiver would refuse it, and cutting it short
	// could make two effects share a key.
	MaxLen int
}

// The presets of the receivers oncekit knows. Each one's key format and
// limit is the one its provider documents.
var (
	// DefaultKey sends Idempotency-Key (IETF httpapi draft) with no limit
	// of its own, besides webhook-id. It is the zero Config's.
	DefaultKey = KeyPreset{Provider: "default", Header: "Idempotency-Key"}
	// Stripe: Idempotency-Key, any string of up to 255 characters (Stripe
	// suggests V4 UUIDs or random strings with enough entropy).
	Stripe = KeyPreset{Provider: "Stripe", Header: "Idempotency-Key", MaxLen: 255}
	// PayPal: PayPal-Request-Id, a unique client-generated ID of 1 to 108
	// characters (the Orders v2 and Payments v2 references).
	PayPal = KeyPreset{Provider: "PayPal", Header: "PayPal-Request-Id", MaxLen: 108}
	// Twilio: I-Twilio-Idempotency-Token, the header Twilio's own webhooks
	// carry for receivers to dedup on; Twilio documents it as a unique token
	// per event and states no format or length.
	Twilio = KeyPreset{Provider: "Twilio", Header: "I-Twilio-Idempotency-Token"}
	// Adyen: Idempotency-Key, a unique string of at most 64 characters
	// (Adyen suggests a V4 UUID).
	Adyen = KeyPreset{Provider: "Adyen", Header: "Idempotency-Key", MaxLen: 64}
	// StandardWebhooks: webhook-id alone, the message ID the Standard
	// Webhooks specification has receivers dedup on (the same on every
	// retry of a message; no length is set).
	StandardWebhooks = KeyPreset{Provider: "Standard Webhooks", Header: ""}
)

// ErrKeyTooLong is the definite error of a call whose key is longer than the
// provider's KeyPreset.MaxLen.
var ErrKeyTooLong = errors.New("webhook: idempotency key longer than the provider accepts")

// keyHeader returns the header name the key goes in ("" for none besides
// webhook-id) and validates the preset.
func (k KeyPreset) keyHeader() (string, error) {
	if k.MaxLen < 0 {
		return "", cfgerr.New(ErrInvalidConfig, "webhook: Config.Key.MaxLen", "%d is negative", k.MaxLen)
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
