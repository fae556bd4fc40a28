package oncekitotel

import (
	"context"
	"errors"
	"maps"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/sideeffect"
)

const codesError = codes.Error

func httpMethod(m string) attribute.KeyValue { return semconv.HTTPRequestMethodKey.String(m) }
func httpRoute(r string) attribute.KeyValue  { return semconv.HTTPRouteKey.String(r) }
func httpStatus(s int) attribute.KeyValue    { return semconv.HTTPResponseStatusCodeKey.Int(s) }

// messageAttrs are the messaging conventions' attributes of m.
func messageAttrs(op attribute.KeyValue, system string, m broker.Message) []attribute.KeyValue {
	return []attribute.KeyValue{op, semconv.MessagingSystemKey.String(system),
		semconv.MessagingDestinationNameKey.String(m.Subject), semconv.MessagingMessageIDKey.String(m.ID.String())}
}

// Publisher wraps the relay's publisher with a "send" span per message
// (system names the broker: "nats", "rabbitmq"...): a child of the
// context the message was enqueued in, whose context the message carries
// from then on. It has exactly pub's capabilities (broker.Decorate): a
// publisher that chains a key's messages (natsjs) keeps doing so, one that
// reports its connection keeps reporting it.
func Publisher(pub broker.Publisher, system string, cfg *Config) broker.Publisher {
	return broker.Decorate(pub, &publisher{pub: pub, system: system, tracer: cfg.tracer(), prop: cfg.propagator()})
}

// publisher is the tracing broker.Decorator of pub.
type publisher struct {
	pub    broker.Publisher
	system string
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

func (p *publisher) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	msgs, spans := p.start(ctx, msgs)
	return p.end(spans, p.pub.Publish(ctx, msgs))
}

// PublishChain publishes through the wrapped publisher's PublishChain, a
// span per message.
func (p *publisher) PublishChain(ctx context.Context, msgs []broker.Message, prev []int) []broker.Result {
	msgs, spans := p.start(ctx, msgs)
	return p.end(spans, p.pub.(broker.ChainPublisher).PublishChain(ctx, msgs, prev))
}

// Connected forwards the wrapped publisher's connection state, which the
// relay reads when the publisher offers it.
func (p *publisher) Connected() bool { return p.pub.(broker.ConnectedPublisher).Connected() }

// start opens a send span per message and returns copies of msgs carrying
// their span's context.
func (p *publisher) start(ctx context.Context, msgs []broker.Message) ([]broker.Message, []trace.Span) {
	out := make([]broker.Message, len(msgs))
	spans := make([]trace.Span, len(msgs))
	for i, m := range msgs {
		mctx := p.prop.Extract(ctx, propagation.MapCarrier(m.Headers))
		mctx, spans[i] = p.tracer.Start(mctx, "send "+m.Subject, trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(messageAttrs(semconv.MessagingOperationTypeSend, p.system, m)...))
		h := maps.Clone(m.Headers)
		if h == nil {
			h = map[string]string{}
		}
		p.prop.Inject(mctx, propagation.MapCarrier(h))
		m.Headers = h
		out[i] = m
	}
	return out, spans
}

func (p *publisher) end(spans []trace.Span, res []broker.Result) []broker.Result {
	for i, span := range spans {
		if i < len(res) && res[i].Err != nil {
			span.RecordError(res[i].Err)
			span.SetStatus(codes.Error, "not acknowledged")
		}
		span.End()
	}
	return res
}

// Handler wraps an inbox handler with a "process" span per message: a
// child of the context the consumer extracted from the message (its send
// span, with Propagator on inbox.Config), and linked to it.
func Handler(h inbox.Handler, system string, cfg *Config) inbox.Handler {
	tracer := cfg.tracer()
	return inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(messageAttrs(semconv.MessagingOperationTypeProcess, system, m.Message)...),
			trace.WithAttributes(attribute.Int("messaging.oncekit.attempt", m.Attempt))}
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
		}
		ctx, span := tracer.Start(ctx, "process "+m.Subject, opts...)
		defer span.End()
		err := h.Handle(ctx, tx, m)
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, "handler failed")
		}
		return err
	})
}

// Provider wraps a side-effect provider with a client span per call, a
// child of the context the effect was recorded in (with Propagator on
// sideeffect.Config). The wrapper keeps the
// provider's capabilities: whether it honours keys, its own bound on a
// call, its Lookup.
func Provider(p sideeffect.Provider, cfg *Config) sideeffect.Provider {
	w := &provider{p: p, tracer: cfg.tracer()}
	if l, ok := p.(sideeffect.Looker); ok {
		return &lookingProvider{provider: w, l: l}
	}
	return w
}

type provider struct {
	p      sideeffect.Provider
	tracer trace.Tracer
}

func (w *provider) Call(ctx context.Context, c sideeffect.Call) (string, error) {
	ctx, span := w.tracer.Start(ctx, "call "+c.Kind, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("oncekit.effect.kind", c.Kind), attribute.Int("oncekit.effect.attempt", c.Attempt),
			attribute.Int64("oncekit.effect.id", c.ID)))
	defer span.End()
	ref, err := w.p.Call(ctx, c)
	if err != nil && !errors.Is(err, sideeffect.ErrDuplicate) {
		span.RecordError(err)
		span.SetStatus(codes.Error, "call failed")
	}
	return ref, err
}

// HonoursKeys is the wrapped provider's (true when it does not say).
func (w *provider) HonoursKeys() bool {
	if kh, ok := w.p.(sideeffect.KeyHonourer); ok {
		return kh.HonoursKeys()
	}
	return true
}

// CallBound is the wrapped provider's (0, none, when it does not say).
func (w *provider) CallBound() time.Duration {
	if b, ok := w.p.(sideeffect.Bounded); ok {
		return b.CallBound()
	}
	return 0
}

type lookingProvider struct {
	*provider
	l sideeffect.Looker
}

func (w *lookingProvider) Lookup(ctx context.Context, key string) (string, bool, error) {
	return w.l.Lookup(ctx, key)
}
