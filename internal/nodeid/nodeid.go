// Package nodeid names a process among the owners of leases: relays and
// dispatchers that did not configure a name of their own.
package nodeid

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
)

// New returns "host-pid-random": the hostname, the process ID and 4 random
// bytes in hex, so that two processes (or two owners in one process) differ.
func New() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
