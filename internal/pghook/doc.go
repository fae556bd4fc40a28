// Package pghook wraps a Querier so that a function runs ahead of every
// statement it sends (Hooked).
package pghook
