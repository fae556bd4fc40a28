package tracecontext

import (
	"context"
	"net/textproto"
)

// The W3C Trace Context header names, lower case as the specification
// writes them.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// Carrier holds the headers of one trace context: header name → value.
// Names are lower case when oncekit writes them; Get also finds the
// canonical MIME form ("Traceparent") that some brokers and HTTP deliver.
type Carrier map[string]string

// Get returns the value of name, or of its canonical MIME form
// ("Traceparent" for "traceparent"), or "".
func (c Carrier) Get(name string) string {
	if v, ok := c[name]; ok {
		return v
	}
	switch name { // constants: no string built on the hot path
	case HeaderTraceparent:
		return c["Traceparent"]
	case HeaderTracestate:
		return c["Tracestate"]
	}
	return c[textproto.CanonicalMIMEHeaderKey(name)]
}

// Propagator moves a trace context between a context.Context and a Carrier.
// oncekit calls Inject where a message or effect is written and Extract
// where it is handled or called. Implementations must be safe for
// concurrent use, cheap when ctx or c holds no trace context, and never
// fail: a trace context they cannot read is dropped.
type Propagator interface {
	// Inject returns the trace context of ctx as headers, or nil when ctx
	// has none. oncekit does not modify the returned map.
	Inject(ctx context.Context) Carrier
	// Extract returns ctx carrying the trace context of c, or ctx itself
	// when c holds none (or only an invalid one).
	Extract(ctx context.Context, c Carrier) context.Context
}

// Or returns p, or W3C{} when p is nil: how oncekit fills its Config
// fields of this type.
func Or(p Propagator) Propagator {
	if p == nil {
		return W3C{}
	}
	return p
}
