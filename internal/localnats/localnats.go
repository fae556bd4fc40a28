// Package localnats connects a program to NATS: the server at the given URL
// when one answers, else an in-process nats-server with JetStream in a temp
// dir.
//
// Deprecated: use oncekittest.Connect, which users can import too.
package localnats

import (
	"github.com/nats-io/nats.go"

	"github.com/oncekit/oncekit/oncekittest"
)

// Connect is oncekittest.Connect.
func Connect(url string) (nc *nats.Conn, stop func(), err error) {
	return oncekittest.Connect(url)
}
