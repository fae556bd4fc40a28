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

// A side effect's idempotency key derives from what caused it and its kind:
// the same on every attempt, another for another kind.
func ExampleDeriveKey() {
	fmt.Println(len(oncekit.DeriveKey("pay_123", "email.receipt")))
	fmt.Println(oncekit.DeriveKey("pay_123", "email.receipt") == oncekit.DeriveKey("pay_123", "email.receipt"))
	fmt.Println(oncekit.DeriveKey("pay_123", "email.receipt") == oncekit.DeriveKey("pay_123", "sms.receipt"))
	// Output:
	// 64
	// true
	// false
}
