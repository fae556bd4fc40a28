// Package inbox makes event consumers idempotent: each delivered message is
// claimed in processed_messages in the same PostgreSQL transaction as the
// handler's writes, and the broker is acknowledged only after that
// transaction committed.
//
// For every message the Consumer runs
//
//	BEGIN
//	INSERT INTO processed_messages (consumer, message_id) ... ON CONFLICT DO NOTHING
//	-- claimed: run the Handler with this transaction; not claimed: duplicate
//	COMMIT
//	ack
//
// The dedup identity is the event's own ID (the Oncekit-Event-Id header, or
// Nats-Msg-Id when it is absent), never the broker's sequence number nor a
// fresh Nats-Msg-Id a republisher may give a copy, so a republished copy
// of an event is absorbed exactly like a redelivery. A duplicate is
// acknowledged at once and counted. A commit whose outcome is unknown (the
// connection broke during COMMIT) is never acknowledged: the broker redelivers
// and the claim settles it. Until it settles a message with the broker, the
// consumer signals it in progress every third of the source's AckWait
// (queued, at work, or waiting for a retry), so slow handlers and long
// batches are not redelivered while they run.
//
// Failures lose nothing. A handler error rolls the transaction back and asks
// the broker to redeliver after an exponential backoff (capped); a panicking
// handler is recovered as an error. Errors wrapped with Permanent, messages
// without a valid ID and messages that failed MaxAttempts times are written to
// the dead_letters table (payload, headers, subject, reason, attempts) and then
// acknowledged. Dead-lettering leaves no claim, so a replay (`oncekit dlq
// replay`, which republishes with the original ID) is processed once, and
// replaying a message that was in fact processed is absorbed as a duplicate.
//
// Batch mode (Config.BatchSize > 1) processes many messages in one
// transaction: one statement claims the whole batch and the handlers run one
// after another in the transaction. This is what lifts throughput past one
// commit per message. A batch first runs without savepoints (each costs
// PostgreSQL a subtransaction). If a handler fails, the transaction is rolled
// back and the batch runs again without the failed message, each handler
// under its own SAVEPOINT, so that a further failure rolls back only its
// savepoint and its claim: the failed messages are retried alone while the
// others commit. Handlers that ran before the failure thus run twice on the
// same attempt, the first time in a transaction that was rolled back. After a
// failure the next batches take savepoints from the start for a while. A run
// with savepoints puts at most 64 messages in one transaction, PostgreSQL's
// subtransaction cache; a larger batch runs in several. Round
// trips are saved where the protocol allows: BEGIN and the claim travel
// together, and a message's SAVEPOINT travels with its handler's first
// statement.
//
// The round trip that remains per message is the handler's own statement.
// A handler that only writes can queue its statements with Queue instead:
// they are sent together, in one round trip, with the next statement the
// transaction sends (the commit at the latest), so a batch costs a handful of
// round trips whatever its size. A queued statement that fails fails the
// message that queued it, exactly as a returned error would.
//
// While no duplicate has been seen lately the claim is a plain INSERT, which
// costs PostgreSQL about a third less than ON CONFLICT's speculative
// insertion; a duplicate makes it fail with a unique violation, the
// transaction is begun again with INSERT ... ON CONFLICT DO NOTHING, and the
// next 64 transactions claim that way. The outcome is the same either way.
//
// Ordered mode (Config.Ordered) applies the messages of one key (the
// Oncekit-Key header) in the order of the source's log (the JetStream stream
// sequence; the outbox relay publishes a key's events in order), while
// different keys run in parallel, across crashes, restarts and any number of
// processes of one durable. Keys are hashed onto Concurrency lanes, each
// kept in sequence order. Before a message runs, the consumer checks every
// earlier message of its key above the durable's ack floor: each must have
// taken effect (this process settled it, or its claim or dead letter is in
// the database). If one has not (it is in another process's hands, or was
// held by a process that died and awaits redelivery), the message is held
// back in its lane, kept in progress, without spending a delivery attempt,
// and the key's later messages wait behind it; the other keys go on. The
// consumer learns the log's messages from its own deliveries while they
// come with consecutive delivery sequences, and reads the headers of the
// rest from the log (OrderedSource). A copy of an event already applied and
// a dead-lettered message do not hold their key; a dead letter replayed
// later is a new message of the log and takes effect where it lands. A
// failing message is retried in place (with the same backoff) so that
// nothing behind it on its lane overtakes it. So is a message whose commit
// outcome is unknown: its new attempt's claim finds the commit (a
// duplicate) or processes it, before the key moves on. docs/ordering.md has
// the exact guarantee and its cost.
//
// processed_messages is pruned in bounded batches (Config.Retention,
// Consumer.Prune; replayed dead letters: Config.DeadLetterRetention,
// Consumer.PruneDeadLetters). At
// start the Consumer refuses a retention shorter than the source's redelivery
// horizon (see Horizon), because a claim deleted before the last possible
// redelivery would let that redelivery run the handler a second time.
//
// ReplayWindow runs a window of the log (a natsjs.Window) through the
// consumer's handler again, claim and all: after an asynchronous PostgreSQL
// failover erased transactions whose messages were already acked, it
// applies exactly those again and absorbs the rest.
//
// Watermill users get the same claim in their router handlers' transaction
// from package aspubsub; the consumer reads any watermill subscriber through
// watermill/asbroker.Source.
package inbox
