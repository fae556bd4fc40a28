// Package oncekit makes event-driven services effectively-once end to end on
// PostgreSQL and NATS JetStream.
//
// Delivery stays at-least-once everywhere; every layer that can repeat work
// dedups on a deterministic ID derived from the one before it. A client's
// Idempotency-Key at the HTTP edge (package idempotency) becomes, through
// DeriveID and DeriveKey, the event IDs written to the outbox (package outbox),
// the Nats-Msg-Id the relay publishes with, the claim an inbox consumer makes in
// processed_messages (package inbox), and the idempotency key handed to an
// external provider by the side-effect ledger (package sideeffect).
//
// This package holds the identity functions, which are pure and stable
// forever (changing their output would break retries across deploys, so golden
// vectors in the tests pin them), and the narrow database interfaces every
// other package accepts: Querier, Beginner, DB and Pool, which pgx's own
// types satisfy (*pgxpool.Pool all four; pgx.Tx and *pgx.Conn all but Pool).
package oncekit
