package oncekitotel_test

import (
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/brokertest"
	"github.com/oncekit/oncekit/oncekitotel"
)

// The tracing publisher has exactly the capabilities of the publisher it
// wraps: it neither drops one (the relay would lose PublishChain's single
// round, or tell an outage from refused messages no more) nor claims one.
func TestPublisherKeepsExactlyTheWrappedCapabilities(t *testing.T) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewInMemoryExporter()))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	cfg := &oncekitotel.Config{TracerProvider: tp, Propagator: propagation.TraceContext{}}
	brokertest.RunDecorator(t, func(inner broker.Publisher) broker.Publisher {
		return oncekitotel.Publisher(inner, "test", cfg)
	})
}
