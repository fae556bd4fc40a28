// Package oncekittest helps users test their own handlers against oncekit,
// as rivertest does for River: against a real PostgreSQL and a real NATS
// JetStream server, never mocks.
//
//   - NewDB makes a fresh schema with oncekit's migrations applied, dropped
//     when the test ends, and a pool whose search_path is that schema
//     (DATABASE_URL, default postgres://postgres@127.0.0.1:5432/postgres).
//   - NewNATS starts an in-process nats-server with JetStream in a temp dir,
//     or connects to NATS_URL when it is set. Connect does the same outside
//     tests: the server at a URL when one answers, else an embedded one.
//   - Handle runs one handler on one message as the consumer does, in a
//     transaction with its claim, without a broker (as rivertest.Worker
//     does for River): the quickest test of a handler.
//   - Start runs a relay, consumer or dispatcher in the background for the
//     rest of the test; DrainRelay, DrainConsumer (on any broker) and
//     DrainDispatcher run one until it has nothing left to do, then stop it.
//   - RequireEnqueued and RequireEffect fail the test unless an outbox row or
//     a side effect exists, and return it for further assertions.
//
// Every helper that waits gives up after Timeout and fails the test with
// what it was waiting for.
package oncekittest
