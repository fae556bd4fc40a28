package brokertest

import (
	"context"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
)

// capability is one optional interface of a broker.Publisher, as
// RunDecorator checks it: has tells whether a publisher offers it, and
// forwards checks that out's method reaches inner's.
type capability struct {
	name     string
	has      func(broker.Publisher) bool
	forwards func(t *testing.T, inner *fakePublisher, out broker.Publisher)
}

// capabilities lists every capability package broker declares (its
// Decorator holds Publish and one method per capability): RunDecorator
// fails when broker declares one this list lacks.
var capabilities = []capability{
	{
		name: "ChainPublisher",
		has:  func(p broker.Publisher) bool { _, ok := p.(broker.ChainPublisher); return ok },
		forwards: func(t *testing.T, inner *fakePublisher, out broker.Publisher) {
			msgs := messages(2)
			res := out.(broker.ChainPublisher).PublishChain(context.Background(), msgs, []int{-1, 0})
			require.Equal(t, msgIDs(msgs), resultIDs(res), "one result per message, in order")
			calls, prev := inner.chains()
			require.Equal(t, 1, calls, "PublishChain reaches the wrapped publisher's PublishChain")
			require.Equal(t, []int{-1, 0}, prev, "with the same chain")
		},
	},
	{
		name: "ConnectedPublisher",
		has:  func(p broker.Publisher) bool { _, ok := p.(broker.ConnectedPublisher); return ok },
		forwards: func(t *testing.T, inner *fakePublisher, out broker.Publisher) {
			c := out.(broker.ConnectedPublisher)
			inner.setUp(false)
			require.False(t, c.Connected(), "Connected reports the wrapped publisher's state (down)")
			inner.setUp(true)
			require.True(t, c.Connected(), "Connected reports the wrapped publisher's state (up)")
		},
	},
}

// fakes makes a publisher with the capabilities of the bits of its index
// (bit i: capabilities[i]).
var fakes = []func(*fakePublisher) broker.Publisher{
	func(f *fakePublisher) broker.Publisher { return plainFake{f} },
	func(f *fakePublisher) broker.Publisher { return chainFake{plainFake{f}} },
	func(f *fakePublisher) broker.Publisher { return connectedFake{plainFake{f}} },
	func(f *fakePublisher) broker.Publisher { return chainConnectedFake{plainFake{f}} },
}

// RunDecorator checks that wrap, a Publisher decorator (eventsig's
// SignPublisher, oncekitotel's Publisher), keeps each capability package
// broker declares exactly when the publisher it wraps has it: for every
// combination of capabilities, wrapping a publisher with capability X
// yields one with X, whose method reaches the wrapped one's, and wrapping
// one without X yields one without X. Publish must reach the wrapped
// publisher's Publish (or PublishChain).
func RunDecorator(t *testing.T, wrap func(inner broker.Publisher) broker.Publisher) {
	t.Helper()
	methods := reflect.TypeFor[broker.Decorator]().NumMethod()
	require.Equal(t, 1+len(capabilities), methods,
		"package broker declares %d capabilities; brokertest's list has %d: add the new one to it", methods-1, len(capabilities))
	require.Len(t, fakes, 1<<len(capabilities), "a fake publisher for each combination of capabilities")
	for set, mk := range fakes {
		var names []string
		for i, c := range capabilities {
			if set&(1<<i) != 0 {
				names = append(names, c.name)
			}
		}
		name := "inner=" + strings.Join(append([]string{"Publisher"}, names...), "+")
		t.Run(name, func(t *testing.T) {
			f := &fakePublisher{up: true}
			inner := mk(f)
			for i, c := range capabilities {
				require.Equal(t, set&(1<<i) != 0, c.has(inner), "the fake's %s", c.name)
			}
			out := wrap(inner)
			require.NotNil(t, out)
			for i, c := range capabilities {
				if set&(1<<i) == 0 {
					require.False(t, c.has(out), "the decorator claims %s, which the publisher it wraps lacks", c.name)
					continue
				}
				require.True(t, c.has(out), "the decorator drops %s, which the publisher it wraps has", c.name)
				c.forwards(t, f, out)
			}
			msgs := messages(3)
			res := out.Publish(context.Background(), msgs)
			require.Equal(t, msgIDs(msgs), resultIDs(res), "one result per message, in order")
			require.Positive(t, f.publishes(), "Publish reaches the wrapped publisher")
		})
	}
}

func messages(n int) []broker.Message {
	msgs := make([]broker.Message, n)
	for i := range msgs {
		msgs[i] = broker.Message{ID: uuid.New(), Subject: "decorated", Key: "k", Payload: []byte("p")}
	}
	return msgs
}

func msgIDs(msgs []broker.Message) []uuid.UUID {
	out := make([]uuid.UUID, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

func resultIDs(res []broker.Result) []uuid.UUID {
	out := make([]uuid.UUID, len(res))
	for i, r := range res {
		out[i] = r.ID
	}
	return out
}

// fakePublisher acknowledges everything and counts the calls that reach it.
type fakePublisher struct {
	mu        sync.Mutex
	published int
	chained   int
	lastPrev  []int
	up        bool
}

func (f *fakePublisher) Publish(_ context.Context, msgs []broker.Message) []broker.Result {
	f.mu.Lock()
	f.published++
	f.mu.Unlock()
	return acked(msgs)
}

func (f *fakePublisher) publishChain(_ context.Context, msgs []broker.Message, prev []int) []broker.Result {
	f.mu.Lock()
	f.published++
	f.chained++
	f.lastPrev = append([]int(nil), prev...)
	f.mu.Unlock()
	return acked(msgs)
}

func (f *fakePublisher) connected() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.up
}

func (f *fakePublisher) setUp(up bool) {
	f.mu.Lock()
	f.up = up
	f.mu.Unlock()
}

func (f *fakePublisher) publishes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.published
}

func (f *fakePublisher) chains() (int, []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.chained, f.lastPrev
}

func acked(msgs []broker.Message) []broker.Result {
	res := make([]broker.Result, len(msgs))
	for i, m := range msgs {
		res[i] = broker.Result{ID: m.ID}
	}
	return res
}

type plainFake struct{ f *fakePublisher }

func (p plainFake) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	return p.f.Publish(ctx, msgs)
}

type chainFake struct{ plainFake }

func (p chainFake) PublishChain(ctx context.Context, msgs []broker.Message, prev []int) []broker.Result {
	return p.f.publishChain(ctx, msgs, prev)
}

type connectedFake struct{ plainFake }

func (p connectedFake) Connected() bool { return p.f.connected() }

type chainConnectedFake struct{ plainFake }

func (p chainConnectedFake) PublishChain(ctx context.Context, msgs []broker.Message, prev []int) []broker.Result {
	return p.f.publishChain(ctx, msgs, prev)
}

func (p chainConnectedFake) Connected() bool { return p.f.connected() }
