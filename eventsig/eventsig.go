package eventsig

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"

	"github.com/oncekit/oncekit/broker"
)

// Headers a signed event carries.
const (
	// HeaderKeyID names the key that signed the event.
	HeaderKeyID = "Oncekit-Signature-Key"
	// HeaderSignature holds the Ed25519 signature, base64 (standard,
	// padded).
	HeaderSignature = "Oncekit-Signature"
)

// ErrUnauthenticated is wrapped by every error Verify returns: the message
// is unsigned, signed by an unknown key, or its signature does not match.
var ErrUnauthenticated = errors.New("eventsig: unauthenticated event")

// signed returns the bytes a signature covers: the event ID, then the
// subject, the ordering key and the payload, each prefixed by its length,
// under a version tag.
func signed(m *broker.Message) []byte {
	b := make([]byte, 0, 32+len(m.Subject)+len(m.Key)+len(m.Payload)+24)
	b = append(b, "oncekit-event-v1"...)
	b = append(b, m.ID[:]...)
	for _, part := range [][]byte{[]byte(m.Subject), []byte(m.Key), m.Payload} {
		b = binary.BigEndian.AppendUint64(b, uint64(len(part)))
		b = append(b, part...)
	}
	return b
}

// Signer signs events with one key.
type Signer struct {
	keyID string
	key   ed25519.PrivateKey
}

// NewSigner returns a Signer for key, named keyID in every signature. keyID
// must be non-empty and printable ASCII without spaces.
func NewSigner(keyID string, key ed25519.PrivateKey) (*Signer, error) {
	if err := checkKeyID(keyID); err != nil {
		return nil, err
	}
	if len(key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("eventsig: key %s: want an Ed25519 private key of %d bytes, got %d", keyID, ed25519.PrivateKeySize, len(key))
	}
	return &Signer{keyID: keyID, key: key}, nil
}

func checkKeyID(keyID string) error {
	if keyID == "" || len(keyID) > 64 {
		return fmt.Errorf("eventsig: key ID %q: want 1 to 64 characters", keyID)
	}
	for i := 0; i < len(keyID); i++ {
		if c := keyID[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("eventsig: key ID %q: want printable ASCII without spaces", keyID)
		}
	}
	return nil
}

// Sign returns m with its signature headers set (m's Headers are copied,
// not changed).
func (s *Signer) Sign(m broker.Message) broker.Message {
	h := make(map[string]string, len(m.Headers)+2)
	maps.Copy(h, m.Headers)
	h[HeaderKeyID] = s.keyID
	h[HeaderSignature] = base64.StdEncoding.EncodeToString(ed25519.Sign(s.key, signed(&m)))
	m.Headers = h
	return m
}

// SignPublisher returns a Publisher that signs every message with s before
// pub publishes it: give it to outbox.NewRelay in place of pub. It has
// exactly pub's capabilities (broker.Decorate): its PublishChain and
// Connected, when pub has them (broker/natsjs does).
func SignPublisher(pub broker.Publisher, s *Signer) broker.Publisher {
	return broker.Decorate(pub, signingPublisher{pub: pub, s: s})
}

// signingPublisher is the signing broker.Decorator of pub.
type signingPublisher struct {
	pub broker.Publisher
	s   *Signer
}

func (p signingPublisher) sign(msgs []broker.Message) []broker.Message {
	out := make([]broker.Message, len(msgs))
	for i, m := range msgs {
		out[i] = p.s.Sign(m)
	}
	return out
}

// Publish signs msgs and publishes them.
func (p signingPublisher) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	return p.pub.Publish(ctx, p.sign(msgs))
}

// PublishChain signs msgs and publishes them through the wrapped
// publisher's PublishChain.
func (p signingPublisher) PublishChain(ctx context.Context, msgs []broker.Message, prev []int) []broker.Result {
	return p.pub.(broker.ChainPublisher).PublishChain(ctx, p.sign(msgs), prev)
}

// Connected reports the wrapped publisher's connection.
func (p signingPublisher) Connected() bool { return p.pub.(broker.ConnectedPublisher).Connected() }

// Verifier checks events against the public keys it holds, by key ID. It
// implements inbox.Verifier.
type Verifier struct {
	keys map[string]ed25519.PublicKey
}

// NewVerifier returns a Verifier for keys, by key ID (several during a
// rotation).
func NewVerifier(keys map[string]ed25519.PublicKey) (*Verifier, error) {
	if len(keys) == 0 {
		return nil, errors.New("eventsig: a Verifier needs at least one key")
	}
	v := &Verifier{keys: make(map[string]ed25519.PublicKey, len(keys))}
	for id, k := range keys {
		if err := checkKeyID(id); err != nil {
			return nil, err
		}
		if len(k) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("eventsig: key %s: want an Ed25519 public key of %d bytes, got %d", id, ed25519.PublicKeySize, len(k))
		}
		v.keys[id] = k
	}
	return v, nil
}

// Verify returns nil when m carries a valid signature by one of v's keys,
// and an error wrapping ErrUnauthenticated otherwise.
func (v *Verifier) Verify(m *broker.Message) error {
	keyID, sig := m.Headers[HeaderKeyID], m.Headers[HeaderSignature]
	if keyID == "" || sig == "" {
		return fmt.Errorf("%w: unsigned", ErrUnauthenticated)
	}
	key, ok := v.keys[keyID]
	if !ok {
		return fmt.Errorf("%w: unknown key %.64q", ErrUnauthenticated, keyID)
	}
	raw, err := base64.StdEncoding.DecodeString(sig)
	if err != nil || len(raw) != ed25519.SignatureSize || !ed25519.Verify(key, signed(m), raw) {
		return fmt.Errorf("%w: bad signature by key %s", ErrUnauthenticated, keyID)
	}
	return nil
}
