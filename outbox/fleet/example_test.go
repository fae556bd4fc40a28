package fleet_test

import (
	"fmt"

	"github.com/oncekit/oncekit/outbox/fleet"
)

// Each database goes to the k members with the highest weight for it; when
// a member leaves, only the databases it served move, each to one other.
func ExampleAssign() {
	members := []string{"relay-a", "relay-b", "relay-c", "relay-d"}
	fmt.Println(fleet.Assign("orders", members, 2))
	fmt.Println(fleet.Assign("orders", []string{"relay-a", "relay-b", "relay-d"}, 2))
	fmt.Println(fleet.Budget(16, 2, 5), "connections per member for 16 partitions, k=2, at most 5")
	// Output:
	// [relay-a relay-c]
	// [relay-a relay-d]
	// 5 connections per member for 16 partitions, k=2, at most 5
}
