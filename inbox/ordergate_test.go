package inbox

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
)

// logSource is an OrderedSource over a fixed log whose Scan can be made to
// stop short, as a reader on a replica that lags the stream does.
type logSource struct {
	broker.Source
	log   []broker.Scanned
	short bool // Scan returns nothing, as if the log ended
}

func (s *logSource) AckFloor(context.Context) (uint64, error) { return 0, nil }

func (s *logSource) Scan(_ context.Context, from, to uint64) ([]broker.Scanned, error) {
	if s.short || to < from {
		return nil, nil
	}
	var out []broker.Scanned
	for _, m := range s.log {
		if m.Sequence >= from {
			out = append(out, m)
			if m.Sequence >= to {
				break
			}
		}
	}
	return out, nil
}

func keyed(seq uint64, key string) broker.Scanned {
	return broker.Scanned{Sequence: seq, Headers: map[string][]string{
		broker.HeaderKey: {key}, broker.HeaderMsgID: {"m" + string(rune('0'+seq))}}}
}

func newTestGate(t *testing.T, src *logSource) *orderGate {
	g := newOrderGate(src, nil, nil, "test", slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, g.start(context.Background()))
	return g
}

// heldBehind reports whether a delivery of seq with key would be held back.
func heldBehind(g *orderGate, seq uint64, key string) bool {
	ok, _ := g.check([]*item{{seq: seq, key: key}})
	return !ok[0]
}

// Consecutive delivery sequences do not show that no other process
// received a message in between: a new consumer leader whose state lags
// the old one numbers its deliveries again from where its state ends.
func TestOrderGateReadsGapsBetweenConsecutiveDeliveries(t *testing.T) {
	src := &logSource{log: []broker.Scanned{keyed(1, "a"), keyed(2, "k"), keyed(3, "k")}}
	g := newTestGate(t, src)
	g.observe([]*item{{seq: 1, dseq: 7, attempt: 1, key: "a", rawID: "m1"}})
	g.observe([]*item{{seq: 3, dseq: 8, attempt: 1, key: "k", rawID: "m3"}}) // 2 went to another process
	require.NoError(t, g.scanTo(context.Background(), 3))
	require.True(t, heldBehind(g, 3, "k"), "3 waits for 2, another process's message of its key")
}

// A scan that stops before the sequence asked for (its reader lags the
// stream, or believes the rest deleted) proves nothing past where it
// stopped: the gate holds instead of taking the rest as known.
func TestOrderGateHoldsWhenTheScanStopsShort(t *testing.T) {
	src := &logSource{log: []broker.Scanned{keyed(1, "k"), keyed(2, "k")}, short: true}
	g := newTestGate(t, src)
	g.observe([]*item{{seq: 2, dseq: 2, attempt: 1, key: "k", rawID: "m2"}})
	require.Error(t, g.scanTo(context.Background(), 2), "a short scan is an error")
	src.short = false
	require.NoError(t, g.scanTo(context.Background(), 2))
	require.True(t, heldBehind(g, 2, "k"), "2 waits for 1, read once the scan reaches it")
}
