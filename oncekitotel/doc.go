// Package oncekitotel traces oncekit with OpenTelemetry, in a module of its
// own so that the core carries no tracing SDK.
//
// Propagator carries the OpenTelemetry span context through oncekit's
// tracecontext seam: set it on outbox.Config, inbox.Config and
// sideeffect.Config (a dispatcher uses its ledger's), and the span of the
// request that enqueued an event is the parent of everything it causes. The
// wrappers add spans after the OpenTelemetry semantic conventions:
//
//   - Edge: a server span per HTTP request (wrap the idempotency route);
//   - Publisher: a "send" span per message the relay publishes, a child of
//     the context the message was enqueued in, whose context the message
//     then carries;
//   - Handler: a "process" span per message the inbox hands a handler, a
//     child of the message's send span and linked to it;
//   - Provider: a client span per call the dispatcher makes, a child of the
//     context the effect was recorded in.
//
// One request, one trace: edge → send → process → the provider's call.
package oncekitotel
