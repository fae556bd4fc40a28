package idempotency_test

import (
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
)

// fingerprintCases cover each path of Fingerprint: canonical JSON (whose
// member order and number spelling do not count), +json types, raw bodies,
// JSON that cannot be canonicalized or holds a number a double cannot keep,
// and an empty body.
var fingerprintCases = []struct {
	method, operation, target, contentType, body, want string
}{
	{"POST", "create-payment", "/payments", "application/json", `{"amount":100,"currency":"EUR"}`, "42dac1a844f91159f0b0f7ad26fbca02095f226b2ce90a7f3dcff936af2cd694"},
	{"POST", "create-payment", "/payments", "application/json; charset=utf-8", "{ \"currency\": \"EUR\", \"amount\": 1e2 }", "42dac1a844f91159f0b0f7ad26fbca02095f226b2ce90a7f3dcff936af2cd694"},
	{"POST", "create-payment", "/payments", "application/problem+json", `{"amount":100,"currency":"EUR"}`, "42dac1a844f91159f0b0f7ad26fbca02095f226b2ce90a7f3dcff936af2cd694"},
	{"POST", "create-payment", "/payments?dry=1", "application/json", `{"amount":100,"currency":"EUR"}`, "ef81a6c12f55d700ea019d4f8523aa8c8f40fd97121afe568e5ae7a01c6b3d4e"},
	{"PUT", "create-payment", "/payments", "application/json", `{"amount":100,"currency":"EUR"}`, "bbf6f932448a473fb67b6f39703c0f4ff8e8209c5b608a7fa8e3e559b0cb2f53"},
	{"POST", "create-payment", "/payments", "text/plain", `{"amount":100,"currency":"EUR"}`, "7bc1c3d019f7ea26261a0a8a398b4e792e72ca1eea352fd29734fbf2e9bf57f0"},
	{"POST", "create-payment", "/payments", "application/json", `{"id":9007199254740993}`, "cfc4f14de72a86eb0a5a6031b6184d536358f7a89e0ef33daa8b4ecccdd7de7d"},
	{"POST", "create-payment", "/payments", "application/json", `{"amount":`, "9c688e06af77588b8d8f9cb8ff60a54576382b0838f95034bfbb552cf08fa36e"},
	{"POST", "create-payment", "/payments", "", "", "70fc229c25591149a684218c120dbaf3e343b526af76f40314ceb538191db9bb"},
	{"POST", "create-payment", "/payments", "application/json", `{"name":"Zoë","tags":["a","\u00e9"],"n":-0.0}`, "06b55e3cd9f6032fca678548f5fd0609197c43a6502150c3d0a6fb78b5f267e4"},
}

// The fingerprints are pinned: a change to Fingerprint or to the canonical
// form would turn every honest retry across the deploy that ships it into
// a 422. Change them only with a new version tag in Fingerprint's input.
func TestFingerprintGoldenVectors(t *testing.T) {
	t.Parallel()
	for _, c := range fingerprintCases {
		got := hex.EncodeToString(idempotency.Fingerprint(c.method, c.operation, c.target, c.contentType, []byte(c.body)))
		require.Equal(t, c.want, got, "%s %s %q %q", c.method, c.target, c.contentType, c.body)
	}
}
