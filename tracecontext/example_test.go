package tracecontext_test

import (
	"context"
	"fmt"

	"github.com/oncekit/oncekit/tracecontext"
)

// A service without a tracing SDK passes on the trace context it received
// (say, from an HTTP request's headers) to oncekit.
func ExampleContextWith() {
	ctx := tracecontext.ContextWith(context.Background(), tracecontext.Context{
		Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	})
	// outbox.Enqueue(ctx, ...) now adds this header to its messages.
	fmt.Println(tracecontext.W3C{}.Inject(ctx))
	// Output: map[traceparent:00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01]
}
