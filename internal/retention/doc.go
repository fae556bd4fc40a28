// Package retention holds what every retention loop shares: its defaults,
// the pacing of its statements (Spaced, Spacing) and the pass over a table
// in physical order that a BRIN index allows (PruneInTIDOrder).
package retention
