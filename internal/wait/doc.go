// Package wait holds the context-aware sleep the relay and the HTTP edge
// poll with.
package wait
