// Package brokertests runs watermill/asbroker against RabbitMQ and Redis
// Streams, through watermill's adapters: the conformance suite and the
// end-to-end crash tests. It is a module of its own so that the library's
// go.mod carries no RabbitMQ or Redis client.
package brokertests
