// Package brokertest is the conformance suite every oncekit broker adapter
// passes, as watermill's pubsub/tests is for watermill Pub/Subs.
//
// An adapter's test calls Run with a Harness that creates an isolated
// destination per test (its own stream, queue or Redis stream) and declares
// the Features the broker offers. The suite checks, against the real
// broker: publish and ack, batch publish with one result per message, dedup
// by event ID where offered, reported to the publisher (JetStream) or
// silent (an SQS FIFO queue), and, where it is not, that both copies arrive
// carrying the same event ID, so the inbox's claim can dedup them; headers
// round-trip (traceparent and tracestate included), redelivery of what a
// consumer received and never acked, nak with a delay, per-key order where
// promised, and close semantics.
//
// Redelivery after a crash is checked with a consumer that is closed
// without acking, in the test process: the suite cannot know how to reach
// an adapter's broker from a child process, and what the broker sees is the
// same (a consumer that went away with messages unsettled). The end-to-end
// tests of each adapter (relay → broker → inbox) SIGKILL real processes.
//
// RunDecorator checks a Publisher decorator instead (a signing or tracing
// wrapper): for every combination of the capabilities package broker
// declares, the wrapper has exactly those of the publisher it wraps, and
// its methods reach the wrapped publisher's.
package brokertest
