// Package eventsig authenticates events end to end, opt-in: the relay signs
// each event with an Ed25519 key (SignPublisher), and the inbox verifies the
// signature before it claims the event (Verifier, set as
// inbox.Config.Verifier). An event ID is derived, hence predictable: without
// signatures, whoever can publish on a consumer's subject can send a forged
// payload under a genuine event's ID, which the consumer claims and applies,
// and then drops the genuine event as a duplicate. With them, an unsigned or
// forged message is dead-lettered as unauthenticated without a claim, and the
// genuine event still applies.
//
// The signature covers the event ID, the subject, the ordering key and the
// payload; other headers are not authenticated. Each signature names its
// key (HeaderKeyID), so keys rotate: sign with the new key once every
// consumer's Verifier holds it, and drop the old one from the Verifiers once
// no event signed with it can be delivered again. Consumers hold public keys
// only.
//
// A signature does not stop a publisher that is not the relay from
// suppressing an event: one that publishes a genuine event's Nats-Msg-Id
// first makes JetStream drop the genuine event within its dedup window.
// Restrict who may publish on the stream's subjects (docs/security.md).
package eventsig
