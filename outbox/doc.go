// Package outbox is the producer half of oncekit: the transactional outbox
// and its relay to the broker.
//
// An Outbox writes events into the outbox table inside the caller's own
// transaction (Enqueue), so the business change and its events commit
// together or not at all. A Relay (NewRelay, Run) reads committed events and
// publishes them, with the event ID as the broker's dedup ID (Nats-Msg-Id on
// JetStream). Each partition keeps a cursor: rows up to it have been read, and
// those the broker acknowledged are published (kept for RelayConfig.Retention,
// then deleted in batches by Relay.Prune); the others are held for a retry, parked, or wait
// behind a blocked row of their key.
//
// Ordering is per ordering key: rows carry a partition (a stable hash of the
// key), each partition is owned by one relay at a time through a lease with a
// fencing token, and within a partition rows are read in the order of their
// writing transactions (txid, then seq), only once every transaction that
// could still add an earlier row has ended. Several relay processes share the
// partitions fairly; different keys are published in parallel.
//
// The partition count is stated in the database (outbox_epoch) and changed
// online by Repartition: the rows written after the change (a new epoch)
// are published only once those written before it are, except behind a
// parked or retrying row of the earlier epoch, which holds only its key
// (docs/decisions/037-online-repartitioning.md).
//
// A message the broker keeps rejecting blocks only its own key, is retried
// with exponential backoff, and is parked after RelayConfig.MaxAttempts
// attempts: still in the table, visible, and released with Unpark (CLI:
// `oncekit outbox unpark`). Nothing is ever dropped.
//
// With Config.Logical, Enqueue writes each message into the WAL instead
// (pg_logical_emit_message) and a LogicalRelay follows PostgreSQL's logical
// decoding through a replication slot: the same guarantees, commit order,
// no row per message (docs/logical-relay.md).
package outbox
