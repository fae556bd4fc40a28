// Package webhook is oncekit's built-in HTTP webhook provider for the
// side-effect dispatcher: each call is a POST of the effect's payload to a
// configured URL.
//
// Every request carries the effect's idempotency key twice, in the header
// of Config.Key (Idempotency-Key by default, per the IETF httpapi draft; the
// presets Stripe, PayPal, Twilio, Adyen and StandardWebhooks follow each
// provider's header and length limit; a key a preset does not take fails
// the call with a *KeyError before any request) and as webhook-id, and is signed per
// the Standard Webhooks convention (https://www.standardwebhooks.com):
//
//	webhook-id:        the idempotency key (the same on every attempt)
//	webhook-timestamp: Unix seconds of this attempt
//	webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">
//
// with a secret written whsec_<base64 key>. Receivers verify the signature,
// reject stale timestamps, and dedup on webhook-id.
//
// Responses are classified for the dispatcher: 2xx confirms (the reference is
// the RefHeader response header); 408, 409, 425 and 429 and every 5xx are
// indefinite (retried with the same key, after Retry-After when the receiver
// sends one, in seconds or as an HTTP date); every other 4xx, and 3xx, is
// definite (the effect fails, no retry); transport errors and timeouts are
// indefinite. A 2xx with the DuplicateHeader set to "true" is a replay the
// receiver recognised; the dispatcher counts it.
package webhook
