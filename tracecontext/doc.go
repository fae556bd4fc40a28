// Package tracecontext carries W3C Trace Context (traceparent, tracestate) through
// oncekit without a tracing SDK: from the context of Outbox.Enqueue into the
// message's headers, from a delivery's headers into the inbox handler's
// context, and from the context of Ledger.Record into the side effect's row
// and on to the provider's call.
//
// A Propagator moves a trace context between a context.Context and a Carrier
// (header name → value). W3C, the default, keeps the two headers in the
// context under its own key (ContextWith, FromContext). A service that uses
// OpenTelemetry plugs in its propagator instead, through a small adapter
// implementing Propagator, so that spans started by its instrumentation are
// what travels.
package tracecontext
