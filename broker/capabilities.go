package broker

import "context"

// Capabilities. A Publisher may offer more than Publish; the relay asks
// for each capability below by type assertion and works without it. Each
// is declared here once: adapters implement them, and a decorator (a
// Publisher wrapping another: signing, tracing) keeps exactly those of the
// publisher it wraps by way of Decorate, so that wrapping never silently
// takes one away, nor claims one the wrapped publisher lacks.

// ChainPublisher is a Publisher that keeps a key's order within one call
// without a round trip per message (natsjs.Publisher does).
//
// PublishChain is Publish with ordering constraints: when prev[i] >= 0,
// msgs[i] is sent only after msgs[prev[i]] (prev[i] < i) was acknowledged,
// and not at all when that one failed (its Result then holds an error). A
// nil prev means no constraints. Without it the relay publishes a batch in
// waves holding at most one message per key.
type ChainPublisher interface {
	Publisher
	PublishChain(ctx context.Context, msgs []Message, prev []int) []Result
}

// ConnectedPublisher is a Publisher that knows whether its broker is
// reachable (natsjs.Publisher and watermill/asbroker's Publisher do).
//
// Connected reports whether it is now. When every message of a round
// failed while Connected reports false, the relay counts the failures
// against the broker, not the messages: no attempt is counted, nothing is
// parked. Without it every failure counts against its message.
type ConnectedPublisher interface {
	Publisher
	Connected() bool
}

// Decorator is the shape of a Publisher decorator: Publish, and every
// capability, each implemented in terms of the publisher it wraps (calling
// the wrapped publisher's method of the same name). Decorate then gives it
// exactly the capabilities of that publisher. A new capability is added
// here, to Decorate, and to broker/brokertest's list of capabilities, whose
// RunDecorator checks every decorator against it.
type Decorator interface {
	ChainPublisher
	ConnectedPublisher
}

// Decorate returns a Publisher that publishes through d and has each
// capability (ChainPublisher, ConnectedPublisher) exactly when inner, the
// publisher d wraps, has it, through d's method. d's capability methods
// are therefore called only when inner has the capability, and may assert
// it (inner.(ChainPublisher)).
func Decorate(inner Publisher, d Decorator) Publisher {
	_, chain := inner.(ChainPublisher)
	_, connected := inner.(ConnectedPublisher)
	p := decorated{d}
	switch {
	case chain && connected:
		return chainConnectedPublisher{p}
	case chain:
		return chainPublisher{p}
	case connected:
		return connectedPublisher{p}
	default:
		return p
	}
}

// decorated offers Publish only; the types embedding it add capabilities.
type decorated struct{ d Decorator }

func (p decorated) Publish(ctx context.Context, msgs []Message) []Result {
	return p.d.Publish(ctx, msgs)
}

type chainPublisher struct{ decorated }

func (p chainPublisher) PublishChain(ctx context.Context, msgs []Message, prev []int) []Result {
	return p.d.PublishChain(ctx, msgs, prev)
}

type connectedPublisher struct{ decorated }

func (p connectedPublisher) Connected() bool { return p.d.Connected() }

type chainConnectedPublisher struct{ decorated }

func (p chainConnectedPublisher) PublishChain(ctx context.Context, msgs []Message, prev []int) []Result {
	return p.d.PublishChain(ctx, msgs, prev)
}

func (p chainConnectedPublisher) Connected() bool { return p.d.Connected() }
