// Package crashpoint lets crash tests kill a real oncekit process at a named
// point in its work. When the environment variable ONCEKIT_CRASHPOINT names a
// point, the process sends itself SIGKILL when it reaches that point: no
// deferred function, no flush, no graceful shutdown runs, exactly as in a power
// cut. Unset (always, in production), Hit costs one string comparison.
package crashpoint

import (
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
)

// The inbox's crash points: handled, not committed; committed, not acked.
const (
	InboxBeforeCommit = "inbox.before-commit"
	InboxAfterCommit  = "inbox.after-commit"
)

// EnvVar names the crash point a process should die at.
const EnvVar = "ONCEKIT_CRASHPOINT"

// EnvAfter, when set to N > 0, makes the process die at the N-th hit of the
// point instead of the first.
const EnvAfter = "ONCEKIT_CRASHPOINT_AFTER"

var (
	armed = os.Getenv(EnvVar)
	after = func() int64 {
		n, err := strconv.ParseInt(os.Getenv(EnvAfter), 10, 64)
		if err != nil || n < 1 {
			return 1
		}
		return n
	}()
	hits atomic.Int64
)

// Hit kills the process with SIGKILL if name is the armed crash point.
func Hit(name string) {
	if armed == "" || armed != name {
		return
	}
	if hits.Add(1) < after {
		return
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL is not deliverable late; never return
}
