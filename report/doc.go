// Package report reads the figures of one oncekit schema that `oncekit
// status` prints and the console's overview shows: the outbox's backlog by
// partition range, its owners and parked keys, the consumers, dead letters,
// effects by kind and state, and the edge's records. Every figure reads
// through an index or under a limit, in one read-only transaction the
// caller begins (Read), so that a service's own status page or check can
// show what the CLI shows.
package report
