package main

import (
	"crypto/ed25519"
	"encoding/base64"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/eventsig"
)

// --signing-key takes a base64 seed or private key; what the relay signs
// with it verifies with the public key, and a bad file is refused without
// printing its content.
func TestRelaySigningKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	seed := make([]byte, ed25519.SeedSize)
	seed[0] = 7
	priv := ed25519.NewKeyFromSeed(seed)
	for name, raw := range map[string][]byte{"seed": seed, "private": priv} {
		file := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(file, []byte(base64.StdEncoding.EncodeToString(raw)+"\n"), 0o600))
		s, err := readSigner(file, "relay-1")
		require.NoError(t, err)
		v, err := eventsig.NewVerifier(map[string]ed25519.PublicKey{"relay-1": priv.Public().(ed25519.PublicKey)})
		require.NoError(t, err)
		m := s.Sign(broker.Message{ID: uuid.New(), Subject: "s", Payload: []byte("p")})
		require.NoError(t, v.Verify(&m), name)
	}
	bad := filepath.Join(dir, "bad")
	require.NoError(t, os.WriteFile(bad, []byte("c2VjcmV0"), 0o600))
	_, err := readSigner(bad, "relay-1")
	require.ErrorContains(t, err, "holds 6 bytes")
	require.NotContains(t, err.Error(), "c2VjcmV0")
	_, err = readSigner(bad, "")
	require.Error(t, err)
}
