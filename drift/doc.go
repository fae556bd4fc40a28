// Package drift proves that oncekit's chain held. A Checker runs a set of
// checks against the database, each yielding a figure and whether it is
// drift:
//
//   - outbox backlog and oldest unpublished age, and parked messages;
//   - side effects fired and past their lease (a dispatcher died mid-call and
//     nothing recovered them), in state unknown, or pending long past due;
//   - HTTP idempotency records in progress past their lease;
//   - dead letters not yet replayed or purged;
//   - user rules: side effects expected exactly once for declared sources
//     (ExpectEffects), or any SQL that returns the rows that are wrong (Rule).
//
// Run it periodically (`oncekit drift`, or Checker.Run from a job): it prints a
// table, exits non-zero on drift and exports every figure as a Prometheus gauge.
package drift
