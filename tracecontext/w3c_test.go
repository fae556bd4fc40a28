package tracecontext_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/tracecontext"
)

const validTP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestValidTraceparent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		in   string
		ok   bool
	}{
		{"spec example", validTP, true},
		{"not sampled", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", true},
		{"future version, longer", "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds", true},
		{"future version, same length", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", true},
		{"empty", "", false},
		{"version ff", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false},
		{"version 00 with more fields", validTP + "-00", false},
		{"future version, no dash after flags", "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", false},
		{"upper-case hex", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", false},
		{"zero trace id", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", false},
		{"zero parent id", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", false},
		{"short trace id", "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", false},
		{"non-hex flags", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g", false},
		{"non-hex version", "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false},
		{"wrong separator", "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false},
		{"space", " 0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.ok, tracecontext.ValidTraceparent(tc.in), tc.in)
		})
	}
}

func TestW3CRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var p tracecontext.W3C
	require.Nil(t, p.Inject(ctx), "no trace context, no headers")
	require.Equal(t, ctx, p.Extract(ctx, nil))
	require.Equal(t, ctx, p.Extract(ctx, tracecontext.Carrier{"other": "x"}))

	in := tracecontext.Carrier{"traceparent": validTP, "tracestate": "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"}
	got := p.Inject(p.Extract(ctx, in))
	require.Equal(t, in, got)

	// The canonical MIME form some transports deliver is read too.
	got = p.Inject(p.Extract(ctx, tracecontext.Carrier{"Traceparent": validTP}))
	require.Equal(t, tracecontext.Carrier{"traceparent": validTP}, got)
}

func TestW3CDropsInvalid(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var p tracecontext.W3C
	// An invalid traceparent is dropped with its tracestate; no error.
	out := p.Extract(ctx, tracecontext.Carrier{"traceparent": strings.ToUpper(validTP), "tracestate": "a=b"})
	_, ok := tracecontext.FromContext(out)
	require.False(t, ok)
	require.Nil(t, p.Inject(out))
	// A tracestate that cannot be a header value is dropped alone.
	out = p.Extract(ctx, tracecontext.Carrier{"traceparent": validTP, "tracestate": "a=b\r\nX-Evil: 1"})
	require.Equal(t, tracecontext.Carrier{"traceparent": validTP}, p.Inject(out))
	// ContextWith validates the same way.
	require.Equal(t, ctx, tracecontext.ContextWith(ctx, tracecontext.Context{Traceparent: "00-bad"}))
}

func TestExtractDoesNotAllocateWithoutTrace(t *testing.T) {
	ctx := context.Background()
	var p tracecontext.Propagator = tracecontext.W3C{}
	h := tracecontext.Carrier{"Oncekit-Event-Id": "x", "Nats-Msg-Id": "x"}
	allocs := testing.AllocsPerRun(1000, func() {
		_ = p.Extract(ctx, h)
		_ = p.Inject(ctx)
	})
	require.Zero(t, allocs)
}

func FuzzTraceparent(f *testing.F) {
	f.Add(validTP, "congo=t61rcWkgMzE")
	f.Add("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", "")
	f.Add("00-00000000000000000000000000000000-00f067aa0ba902b7-01", "a=b")
	f.Fuzz(func(t *testing.T, tp, ts string) {
		var p tracecontext.W3C
		ctx := p.Extract(context.Background(), tracecontext.Carrier{"traceparent": tp, "tracestate": ts})
		c := p.Inject(ctx)
		if !tracecontext.ValidTraceparent(tp) {
			if c != nil {
				t.Fatalf("invalid %q kept", tp)
			}
			return
		}
		if c["traceparent"] != tp {
			t.Fatalf("traceparent %q became %q", tp, c["traceparent"])
		}
		// What is kept can be sent as a header and parses the same again.
		for _, v := range c {
			if strings.ContainsAny(v, "\r\n\x00") {
				t.Fatalf("header value %q", v)
			}
		}
		if again := p.Inject(p.Extract(context.Background(), c)); len(again) != len(c) {
			t.Fatalf("round trip changed %v into %v", c, again)
		}
		// Version 00 is exactly the four fields, lower-case hex.
		if tp[:2] == "00" && (len(tp) != 55 || strings.ToLower(tp) != tp) {
			t.Fatalf("accepted %q", tp)
		}
	})
}

// The work oncekit adds on its hot paths when no trace context is present:
// Inject once per Enqueue or Record call, Extract once per handled message.
func BenchmarkNoTrace(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background()) // a few values deep, as in a service
	defer cancel()
	type k struct{}
	ctx = context.WithValue(ctx, k{}, 1)
	var p tracecontext.Propagator = tracecontext.W3C{}
	h := map[string]string{"Oncekit-Event-Id": "x", "Nats-Msg-Id": "x", "Oncekit-Key": "k"}
	b.Run("Inject", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if p.Inject(ctx) != nil {
				b.Fatal("trace found")
			}
		}
	})
	b.Run("Extract", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if p.Extract(ctx, h) != ctx {
				b.Fatal("trace found")
			}
		}
	})
}
