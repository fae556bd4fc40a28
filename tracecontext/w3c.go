package tracecontext

import (
	"context"
	"strings"
)

// Context is a W3C trace context: a valid traceparent and, optionally, its
// tracestate.
type Context struct {
	// Traceparent is version-traceid-parentid-flags, e.g.
	// "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".
	Traceparent string
	// Tracestate is the vendor list that goes with it, or "".
	Tracestate string
}

type ctxKey struct{}

// ContextWith returns ctx carrying tc, for W3C to inject. An invalid
// traceparent is dropped (ctx is returned as is), and so is a tracestate
// that cannot be sent as a header value.
func ContextWith(ctx context.Context, tc Context) context.Context {
	if !ValidTraceparent(tc.Traceparent) {
		return ctx
	}
	if !validTracestate(tc.Tracestate) {
		tc.Tracestate = ""
	}
	return context.WithValue(ctx, ctxKey{}, tc)
}

// FromContext returns the trace context ctx carries (set by ContextWith or
// by W3C.Extract), and whether it carries one.
func FromContext(ctx context.Context) (Context, bool) {
	tc, ok := ctx.Value(ctxKey{}).(Context)
	return tc, ok
}

// W3C is the default Propagator: it carries the traceparent and tracestate
// headers as a Context in the context.Context (ContextWith, FromContext),
// validating the traceparent per W3C Trace Context level 1.
type W3C struct{}

// Inject returns the traceparent (and tracestate, when set) of ctx, or nil.
func (W3C) Inject(ctx context.Context) Carrier {
	tc, ok := FromContext(ctx)
	if !ok {
		return nil
	}
	if tc.Tracestate == "" {
		return Carrier{HeaderTraceparent: tc.Traceparent}
	}
	return Carrier{HeaderTraceparent: tc.Traceparent, HeaderTracestate: tc.Tracestate}
}

// Extract returns ctx carrying c's trace context. An invalid traceparent
// is dropped together with its tracestate; ctx is then returned as is.
func (W3C) Extract(ctx context.Context, c Carrier) context.Context {
	if len(c) == 0 {
		return ctx
	}
	tp := c.Get(HeaderTraceparent)
	if tp == "" {
		return ctx
	}
	return ContextWith(ctx, Context{Traceparent: tp, Tracestate: c.Get(HeaderTracestate)})
}

// ValidTraceparent reports whether s is a traceparent that W3C Trace
// Context level 1 lets a receiver use: two lower-case hex digits of version
// (not "ff"), a 32-digit trace ID and a 16-digit parent ID that are not all
// zeros, two digits of flags, separated by '-'. Version 00 is exactly 55
// characters; a later version may append fields after a further '-'.
func ValidTraceparent(s string) bool {
	if len(s) < 55 || (len(s) > 55 && (s[:2] == "00" || s[55] != '-')) {
		return false
	}
	if s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return false
	}
	if !hex(s[0:2]) || s[0:2] == "ff" || !hex(s[53:55]) {
		return false
	}
	return hex(s[3:35]) && !zeros(s[3:35]) && hex(s[36:52]) && !zeros(s[36:52])
}

func hex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func zeros(s string) bool { return strings.Trim(s, "0") == "" }

// maxTracestate is the longest tracestate kept: 32 list members of at most
// 256 + 1 + 256 characters would be more, but W3C lets a vendor truncate
// and recommends propagating at least 512 characters.
const maxTracestate = 8192

// validTracestate reports whether s can travel as a header value: printable
// ASCII only, bounded.
func validTracestate(s string) bool {
	if len(s) > maxTracestate {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 0x20 && c != '\t') || c > 0x7e {
			return false
		}
	}
	return true
}
