package oncekitotel

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncekit/oncekit/tracecontext"
)

// instrumentation names the tracer of every span this package starts.
const instrumentation = "github.com/oncekit/oncekit/oncekitotel"

// Config says where the spans go and how contexts travel. The zero value
// uses OpenTelemetry's globals.
type Config struct {
	// TracerProvider starts the spans. Defaults to otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator moves span contexts into and out of headers. Defaults to
	// otel.GetTextMapPropagator().
	Propagator propagation.TextMapPropagator
}

func (c *Config) tracer() trace.Tracer {
	tp := otel.GetTracerProvider()
	if c != nil && c.TracerProvider != nil {
		tp = c.TracerProvider
	}
	return tp.Tracer(instrumentation)
}

func (c *Config) propagator() propagation.TextMapPropagator {
	if c != nil && c.Propagator != nil {
		return c.Propagator
	}
	return otel.GetTextMapPropagator()
}

// Propagator returns the tracecontext.Propagator that carries cfg's
// OpenTelemetry span context through oncekit: set it on outbox.Config,
// inbox.Config and sideeffect.Config (a dispatcher uses its ledger's).
func Propagator(cfg *Config) tracecontext.Propagator { return otelPropagator{cfg.propagator()} }

type otelPropagator struct{ p propagation.TextMapPropagator }

func (o otelPropagator) Inject(ctx context.Context) tracecontext.Carrier {
	c := propagation.MapCarrier{}
	o.p.Inject(ctx, c)
	if len(c) == 0 {
		return nil
	}
	return tracecontext.Carrier(c)
}

func (o otelPropagator) Extract(ctx context.Context, c tracecontext.Carrier) context.Context {
	if len(c) == 0 {
		return ctx
	}
	return o.p.Extract(ctx, propagation.MapCarrier(c))
}

// Edge wraps next (the idempotency route, say) with a server span per
// request, a child of the request's traceparent when it has one: the span
// an enqueued event's trace starts from.
func Edge(next http.Handler, cfg *Config) http.Handler {
	tracer, prop := cfg.tracer(), cfg.propagator()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		route := r.Pattern
		if route == "" {
			route = r.Method
		}
		ctx, span := tracer.Start(ctx, route, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(httpMethod(r.Method), httpRoute(route)))
		defer span.End()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r.WithContext(ctx))
		span.SetAttributes(httpStatus(sw.status))
		if sw.status >= 500 {
			span.SetStatus(codesError, http.StatusText(sw.status))
		}
	})
}

// statusWriter remembers the status a handler answered.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
