// Package sqsbroker is a sketch of an oncekit broker adapter for Amazon SQS
// on the AWS SDK for Go v2: a broker.Publisher for the outbox relay and a
// broker.Source for an inbox consumer.
//
// It is written on the SDK directly because watermill-aws (the watermill
// adapter the brokers table names for SQS) is not served by the module
// proxy this project builds with. Its tests run broker/brokertest on a
// standard and a FIFO queue of fauxqs, an SQS emulator speaking the SDK's
// JSON protocol (installed by scripts/install-fauxqs.sh), not on Amazon's
// SQS.
//
// # What dedup rests on
//
// A standard queue does not dedup at all, and delivers at least once: a
// message the relay publishes twice (it died between publish and mark) is
// stored twice, and SQS itself may deliver one copy more than once. A FIFO
// queue drops a message whose MessageDeduplicationId it has seen within
// the last 5 minutes: the Publisher sets it to the event ID, so a relay's
// re-publish within 5 minutes is dropped by SQS. Everything else (a copy
// published later, a redelivery after a visibility timeout, a replayed dead
// letter) reaches the consumer, and the inbox's claim on the event ID in
// processed_messages is the dedup: keep inbox.Config.Retention longer than
// the longest time a copy can arrive (the queue's retention period, up to
// 14 days).
//
// # Order
//
// A standard queue keeps no order. A FIFO queue keeps the order of one
// message group: the Publisher sets MessageGroupId to the ordering key
// (Oncekit-Key), so a key's messages are delivered in order. One receive
// may carry several messages of a group: apply them on one lane
// (inbox.Config.Concurrency 1, as the example's command does on a FIFO
// queue); the inbox's Ordered mode needs a log SQS does not have.
//
// # Mapping
//
//   - Headers travel as one String message attribute, Oncekit-Headers (a
//     JSON object), because SQS allows at most 10 message attributes; the
//     event ID is also set as the Oncekit-Event-Id attribute, for people
//     reading the queue.
//   - A payload that SQS cannot carry as a message body (not UTF-8, or
//     characters outside SQS's allowed set) is sent base64-encoded, marked
//     by the Oncekit-Body-Encoding attribute.
//   - Ack deletes the message; Nak(delay) sets its visibility timeout to the
//     delay (at most 12 hours); InProgress extends it by the source's
//     AckWait. The delivery count is SQS's ApproximateReceiveCount.
//
// # Bad input
//
//   - A queue that does not exist: Source.Limits returns ErrQueueMissing,
//     so inbox.Consumer.Run refuses to start; a message published to one
//     fails on its own with ErrQueueMissing, and the relay parks it after
//     MaxAttempts (unpark it once the queue exists).
//   - A message larger than PublisherConfig.MaxMessageSize (256 KiB unless
//     set; keep it at the queue's MaximumMessageSize) fails on its own with
//     ErrTooLarge before any call, and is parked the same way; the others
//     go in calls of at most that size in all, as SQS requires of a batch.
//   - SQS unreachable: Publisher is a broker.ConnectedPublisher, so the
//     relay counts an outage against the broker and parks nothing;
//     Source.Limits fails, so a consumer started then returns the error
//     from Run (its supervisor restarts it).
//   - A handler running past the visibility timeout: the consumer keeps
//     the message hidden with InProgress, and it is delivered once.
//   - A queue whose redrive policy moves a message to a dead-letter queue
//     after maxReceiveCount receives: Limits reports it as MaxDeliver, so
//     the consumer refuses a MaxAttempts that would let SQS move a message
//     before the inbox dead-letters it.
package sqsbroker
