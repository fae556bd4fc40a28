package oncekit_test

import (
	"fmt"

	"github.com/oncekit/oncekit"
)

// The edge derives the domain ID from the client's key; the event ID derives
// from the domain ID. A retried request yields the same IDs all the way down.
func ExampleDeriveID() {
	paymentID := oncekit.DeriveID("tenant-1", "client-key-42")
	eventID := oncekit.DeriveID(paymentID.String(), "PaymentCreated")
	again := oncekit.DeriveID(oncekit.DeriveID("tenant-1", "client-key-42").String(), "PaymentCreated")
	fmt.Println(eventID == again)
	// Output: true
}

func ExampleDeriveKey() {
	fmt.Println(len(oncekit.DeriveKey("pay_123", "email.receipt")))
	// Output: 64
}
