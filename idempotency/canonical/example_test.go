package canonical_test

import (
	"errors"
	"fmt"

	"github.com/oncekit/oncekit/idempotency/canonical"
)

// Member order, whitespace and number spelling do not change the canonical
// form, so they do not change a request's fingerprint.
func ExampleJSON() {
	a, _ := canonical.JSON([]byte(`{"currency":"EUR", "amount": 1.50e2}`))
	b, _ := canonical.JSON([]byte("{\n  \"amount\": 150,\n  \"currency\": \"\\u0045UR\"\n}"))
	fmt.Println(string(a))
	fmt.Println(string(a) == string(b))
	// Output:
	// {"amount":150,"currency":"EUR"}
	// true
}

// A 64-bit ID beyond 2^53 has a canonical form, the double nearest to it,
// which it shares with its neighbour; Exact refuses it instead.
func ExampleExact() {
	a, _ := canonical.JSON([]byte(`{"id":9007199254740993}`))
	b, _ := canonical.JSON([]byte(`{"id":9007199254740992}`))
	fmt.Println(string(a) == string(b))
	_, err := canonical.Exact([]byte(`{"id":9007199254740993}`))
	fmt.Println(errors.Is(err, canonical.ErrNotCanonicalizable))
	// Output:
	// true
	// true
}
