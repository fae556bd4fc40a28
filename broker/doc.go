// Package broker defines what oncekit needs from a message broker: the
// Message it moves and a small Publisher interface with a result per message.
// Adapters live in subpackages, one per external system (broker/natsjs).
package broker
