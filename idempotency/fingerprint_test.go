package idempotency_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
)

func TestFingerprintIgnoresOrderAndWhitespace(t *testing.T) {
	t.Parallel()
	a := idempotency.Fingerprint("POST", "pay", "/p", "application/json", []byte(`{"amount":100,"currency":"EUR"}`))
	b := idempotency.Fingerprint("POST", "pay", "/p", "application/json; charset=utf-8", []byte("{ \"currency\" : \"EUR\",\n \"amount\": 1e2 }"))
	c := idempotency.Fingerprint("POST", "pay", "/p", "application/json", []byte(`{"amount":101,"currency":"EUR"}`))
	d := idempotency.Fingerprint("PUT", "pay", "/p", "application/json", []byte(`{"amount":100,"currency":"EUR"}`))
	e := idempotency.Fingerprint("POST", "pay", "/p", "text/plain", []byte(`{"amount":100,"currency":"EUR"}`))
	require.Equal(t, a, b)
	require.NotEqual(t, a, c)
	require.NotEqual(t, a, d)
	require.NotEqual(t, a, e)
}

// Numbers a double cannot hold exactly never share a fingerprint with their
// neighbour (the body is then fingerprinted as raw bytes), while exact
// numbers keep the canonical form's indifference to spelling.
func TestFingerprintKeepsInexactNumbersApart(t *testing.T) {
	t.Parallel()
	fp := func(body string) string {
		return string(idempotency.Fingerprint("POST", "pay", "/p", "application/json", []byte(body)))
	}
	for _, pair := range [][2]string{
		{`{"id":9007199254740993}`, `{"id":9007199254740992}`},
		{`{"id":-9223372036854775807}`, `{"id":-9223372036854775806}`},
		{`{"x":0.10000000000000000001}`, `{"x":0.1}`},
		{`{"x":1e-400}`, `{"x":0}`},
		{`{"x":1e-400}`, `{"x":2e-400}`},
	} {
		require.NotEqual(t, fp(pair[0]), fp(pair[1]), "%s vs %s", pair[0], pair[1])
	}
	for _, pair := range [][2]string{
		{`{"id":9007199254740992}`, `{ "id": 9.007199254740992e15 }`},
		{`{"x":4.50}`, `{"x":45e-1}`},
		{`{"x":100000000000000000000}`, `{"x":1e20}`},
		{`{"x":-0.0}`, `{"x":0}`},
		{`{"x":0.000001}`, `{"x":1E-6}`},
	} {
		require.Equal(t, fp(pair[0]), fp(pair[1]), "%s vs %s", pair[0], pair[1])
	}
}
