package chaos

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/wait"
)

// StreamEvent is one message of the stream, in stream order.
type StreamEvent struct {
	Seq        uint64
	EventID    string
	Key        string
	At         time.Time // when JetStream stored it
	AccountSeq int64     // the payment's account sequence number, from the payload (0: none)
}

// readStream reads every message of the stream in order (an ordered
// consumer: no durable state, nothing acked), so that the checker can tell
// whether an order violation came from publishing or from consuming.
func readStream(ctx context.Context, urls []string, name string) ([]StreamEvent, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	// A cluster that has just healed may still be electing leaders: a read
	// that fails is tried again from the start, on a new connection (which
	// may land on another node), until the timeout. A stream leader that
	// stored the last publishes but served no read for two minutes was
	// seen once after a node's restart ("no responders" to every fetch):
	// every tenth failed read asks the leader to step down.
	var first error
	for attempt := 1; ; attempt++ {
		events, err := readStreamOnce(ctx, urls, name)
		if err == nil {
			return events, nil
		}
		first = cmp.Or(first, err)
		if attempt%10 == 0 {
			stepDown(ctx, urls, name)
		}
		if !wait.Sleep(ctx, 500*time.Millisecond) {
			return nil, fmt.Errorf("%w (after %d reads; the first failed with: %v)", err, attempt, first)
		}
	}
}

// stepDown asks the stream's leader to step down, so that another replica
// leads it; errors are ignored (the next read says what is wrong).
func stepDown(ctx context.Context, urls []string, name string) {
	nc, err := nats.Connect(strings.Join(urls, ","), nats.Timeout(5*time.Second))
	if err != nil {
		return
	}
	defer nc.Close()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, _ = nc.RequestWithContext(rctx, "$JS.API.STREAM.LEADER.STEPDOWN."+name, nil)
}

func readStreamOnce(ctx context.Context, urls []string, name string) ([]StreamEvent, error) {
	nc, err := nats.Connect(strings.Join(urls, ","), nats.Timeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("read stream %s: connect: %w", name, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	st, err := js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("read stream %s: via %s: %w", name, nc.ConnectedUrlRedacted(), err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("read stream %s: info via %s: %w", name, nc.ConnectedUrlRedacted(), err)
	}
	last := info.State.LastSeq
	if info.State.Msgs == 0 {
		return nil, nil
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, fmt.Errorf("read stream %s: ordered consumer via %s: %w", name, nc.ConnectedUrlRedacted(), err)
	}
	var events []StreamEvent
	for len(events) == 0 || events[len(events)-1].Seq < last {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("read stream %s: fetch after %d messages via %s: %w", name, len(events), nc.ConnectedUrlRedacted(), err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			meta, err := m.Metadata()
			if err != nil {
				return nil, err
			}
			var body struct {
				Seq int64 `json:"seq"`
			}
			_ = json.Unmarshal(m.Data(), &body) // hostile messages hold no JSON
			events = append(events, StreamEvent{Seq: meta.Sequence.Stream, EventID: eventID(m.Headers()), Key: m.Headers().Get(broker.HeaderKey), At: meta.Timestamp, AccountSeq: body.Seq})
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, err
		}
		if n == 0 && ctx.Err() != nil {
			return nil, fmt.Errorf("stream %s: read %d of %d messages: %w", name, len(events), last, ctx.Err())
		}
	}
	return events, nil
}

func eventID(h nats.Header) string {
	if id := h.Get(broker.HeaderEventID); id != "" {
		return id
	}
	return h.Get(broker.HeaderMsgID)
}
