// Package wait holds the context-aware sleep the relay and the HTTP edge
// poll with, and the non-blocking check of a done channel.
package wait
