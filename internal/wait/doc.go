// Package wait holds the context-aware waits oncekit's loops share: the
// sleep the relay and the HTTP edge poll with, the retry of a check until it
// passes, the loop of a background job, and the non-blocking check of a done
// channel.
package wait
