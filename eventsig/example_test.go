package eventsig_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"fmt"

	"github.com/google/uuid"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/eventsig"
)

// The relay signs with the private key (eventsig.SignPublisher around its
// publisher); each consumer verifies with the public key alone
// (inbox.Config.Verifier).
func Example() {
	public, private, _ := ed25519.GenerateKey(rand.Reader)
	signer, _ := eventsig.NewSigner("relay-2026", private)
	verifier, _ := eventsig.NewVerifier(map[string]ed25519.PublicKey{"relay-2026": public})

	event := signer.Sign(broker.Message{ID: uuid.New(), Subject: "orders.paid", Payload: []byte(`{"amount":100}`)})
	fmt.Println("genuine:", verifier.Verify(&event))
	event.Payload = []byte(`{"amount":1}`)
	fmt.Println("forged:", verifier.Verify(&event))
	// Output:
	// genuine: <nil>
	// forged: eventsig: unauthenticated event: bad signature by key relay-2026
}
