// Package drift proves that oncekit's chain held. A Checker runs a set of
// checks against the database, each yielding a figure, whether it is drift,
// and the IDs at fault:
//
//   - outbox backlog and oldest unpublished age, and parked messages;
//   - side effects fired and past their lease (a dispatcher died mid-call and
//     nothing recovered them), in state unknown, pending long past due, or
//     failed recently;
//   - HTTP idempotency records in progress past their lease;
//   - dead letters not yet replayed;
//   - consumers whose claims in processed_messages stop short of their
//     redelivery horizon (Horizon);
//   - user rules: the side effects each business ID must have exactly once
//     (Expectation, ExpectEffects), matched on source_id or on a JSON path
//     in the effect's payload, with missing and extra IDs reported apart; or
//     any SQL that returns the rows that are wrong (Rule).
//
// Each check runs under its own timeout; one that times out or fails is
// reported as such and the others still run. Rules can come from Go, from
// flags, or from a YAML file (ReadRules).
//
// Run it periodically (`oncekit drift`, or Checker.Run from a job): it prints
// a table or JSON, exits 0 clean, 1 on drift, 3 when a check could not run,
// and exports every figure as a Prometheus gauge.
package drift
