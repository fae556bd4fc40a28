package natsjs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// windowStream is a test's stream (subjects name.>) holding n messages,
// every third on name.b and the others on name.a, sequences 1 to n.
func windowStream(t *testing.T, n int) (*testenv.NATS, string, jetstream.Stream) {
	t.Helper()
	ctx := context.Background()
	nt := testenv.NewNATS(t)
	name := testenv.Name(t)
	st, err := natsjs.EnsureStream(ctx, nt.JS, natsjs.StreamConfig{Name: name, Subjects: []string{name + ".>"}})
	require.NoError(t, err)
	publishWindow(t, nt, name, 0, n)
	return nt, name, st
}

// publishWindow publishes messages from to to-1 of windowStream's pattern.
func publishWindow(t *testing.T, nt *testenv.NATS, name string, from, to int) {
	t.Helper()
	pub, err := natsjs.NewPublisher(nt.Conn, nil)
	require.NoError(t, err)
	for i := from; i < to; i++ {
		subj := name + ".a"
		if i%3 == 2 {
			subj = name + ".b"
		}
		res := pub.Publish(context.Background(), []broker.Message{{ID: uuid.New(), Subject: subj, Payload: []byte{byte(i)}}})
		require.NoError(t, res[0].Err)
	}
}

// readWindow reads w to its end, max messages per Receive, and returns the
// stream sequences delivered.
func readWindow(t *testing.T, w *natsjs.Window, max int) []uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var seqs []uint64
	for {
		ds, err := w.Receive(ctx, max)
		if errors.Is(err, broker.ErrEndOfWindow) {
			_, err = w.Receive(ctx, max) // and stays ended
			require.ErrorIs(t, err, broker.ErrEndOfWindow)
			return seqs
		}
		require.NoError(t, err)
		require.LessOrEqual(t, len(ds), max)
		for _, d := range ds {
			seq, _ := d.(broker.SequencedDelivery).Sequence()
			seqs = append(seqs, seq)
			require.Equal(t, 1, d.Attempt())
			require.NoError(t, d.Ack(ctx))
			require.NoError(t, d.Nak(ctx, time.Second))
		}
	}
}

func seqRange(from, to uint64, keep func(uint64) bool) []uint64 {
	var out []uint64
	for s := from; s <= to; s++ {
		if keep(s) {
			out = append(out, s)
		}
	}
	return out
}

// onA reports whether sequence s of windowStream is on name.a.
func onA(s uint64) bool { return (s-1)%3 != 2 }

func TestWindowReadsItsStretchAndEnds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nt, name, st := windowStream(t, 30)
	open := func(cfg natsjs.WindowConfig) *natsjs.Window {
		t.Helper()
		cfg.Stream = name
		w, err := natsjs.NewWindow(ctx, nt.JS, cfg)
		require.NoError(t, err)
		t.Cleanup(w.Close)
		return w
	}
	all := func(uint64) bool { return true }

	// By sequence, on one subject.
	w := open(natsjs.WindowConfig{FromSeq: 4, ToSeq: 20, FilterSubjects: []string{name + ".a"}})
	require.Equal(t, uint64(20), w.Last())
	require.Equal(t, seqRange(4, 20, onA), readWindow(t, w, 3))

	// To the stream's end as it was when opened: what is published later
	// is not waited for, and a window on the other subject ends on its own
	// last message although the stream goes on.
	w = open(natsjs.WindowConfig{FromSeq: 1, FilterSubjects: []string{name + ".b"}})
	wa := open(natsjs.WindowConfig{FromSeq: 25, FilterSubjects: []string{name + ".a"}})
	publishWindow(t, nt, name, 30, 40)
	require.Equal(t, uint64(30), w.Last())
	require.Equal(t, seqRange(1, 30, func(s uint64) bool { return !onA(s) }), readWindow(t, w, 100))
	require.Equal(t, seqRange(25, 30, onA), readWindow(t, wa, 100))

	// By time: from the 6th message's time to the 12th's.
	at := func(seq uint64) time.Time {
		m, err := st.GetMsg(ctx, seq)
		require.NoError(t, err)
		return m.Time
	}
	w = open(natsjs.WindowConfig{FromTime: at(6), ToTime: at(12)})
	require.Equal(t, seqRange(6, 12, all), readWindow(t, w, 4))

	// A window holding no message ends at once.
	w = open(natsjs.WindowConfig{FromTime: time.Now()})
	require.Empty(t, readWindow(t, w, 10))
	w = open(natsjs.WindowConfig{FromSeq: 3, ToSeq: 3, FilterSubjects: []string{name + ".a"}})
	require.Empty(t, readWindow(t, w, 10))

	// Windows are ordered consumers of their own: none is left behind.
	info, err := st.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, info.State.Consumers, "the windows' consumers outlive them")
}

func TestWindowRefusesBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nt, name, st := windowStream(t, 9)
	first, err := st.GetMsg(ctx, 1)
	require.NoError(t, err)
	// The stream's retention drops the first three messages.
	require.NoError(t, st.Purge(ctx, jetstream.WithPurgeKeep(6)))
	now := time.Now()
	for _, tc := range []struct {
		name string
		cfg  natsjs.WindowConfig
		want error
	}{
		{"zero window", natsjs.WindowConfig{Stream: name}, natsjs.ErrInvalidWindow},
		{"no stream named", natsjs.WindowConfig{FromSeq: 4}, natsjs.ErrInvalidWindow},
		{"two starts", natsjs.WindowConfig{Stream: name, FromSeq: 4, FromTime: now.Add(-time.Hour)}, natsjs.ErrInvalidWindow},
		{"two ends", natsjs.WindowConfig{Stream: name, FromSeq: 4, ToSeq: 5, ToTime: now}, natsjs.ErrInvalidWindow},
		{"sequence start after end", natsjs.WindowConfig{Stream: name, FromSeq: 8, ToSeq: 5}, natsjs.ErrInvalidWindow},
		{"time start after end", natsjs.WindowConfig{Stream: name, FromTime: now.Add(-time.Minute), ToTime: now.Add(-time.Hour)}, natsjs.ErrInvalidWindow},
		{"empty subject", natsjs.WindowConfig{Stream: name, FromSeq: 4, FilterSubjects: []string{""}}, natsjs.ErrInvalidWindow},
		{"time start in the future", natsjs.WindowConfig{Stream: name, FromTime: now.Add(time.Hour)}, natsjs.ErrWindowInFuture},
		{"sequence start past the stream", natsjs.WindowConfig{Stream: name, FromSeq: 10}, natsjs.ErrWindowInFuture},
		{"sequence start dropped", natsjs.WindowConfig{Stream: name, FromSeq: 2}, natsjs.ErrWindowGone},
		{"time start dropped", natsjs.WindowConfig{Stream: name, FromTime: first.Time}, natsjs.ErrWindowGone},
		{"no such stream", natsjs.WindowConfig{Stream: name + "_none", FromSeq: 1}, natsjs.ErrStreamNotFound},
		{"subject outside the stream", natsjs.WindowConfig{Stream: name, FromSeq: 4, FilterSubjects: []string{"other." + name}}, natsjs.ErrSubjectNotInStream},
		{"wider subject than the stream's", natsjs.WindowConfig{Stream: name, FromSeq: 4, FilterSubjects: []string{">"}}, natsjs.ErrSubjectNotInStream},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := natsjs.NewWindow(ctx, nt.JS, tc.cfg)
			require.ErrorIs(t, err, tc.want)
			require.Nil(t, w)
		})
	}

	var gone *natsjs.WindowGoneError
	_, err = natsjs.NewWindow(ctx, nt.JS, natsjs.WindowConfig{Stream: name, FromSeq: 2})
	require.ErrorAs(t, err, &gone)
	require.Equal(t, uint64(4), gone.FirstSeq)
	require.Contains(t, err.Error(), "retention dropped")
	_, err = natsjs.NewWindow(ctx, nt.JS, natsjs.WindowConfig{Stream: name + "_none", FromSeq: 1})
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)

	// What is left is read from its first message on.
	w, err := natsjs.NewWindow(ctx, nt.JS, natsjs.WindowConfig{Stream: name, FromSeq: gone.FirstSeq})
	require.NoError(t, err)
	defer w.Close()
	require.Equal(t, seqRange(4, 9, func(uint64) bool { return true }), readWindow(t, w, 10))
	// A window whose subject has nothing after its last message ends there
	// (the stream's last message is on the other subject).
	w, err = natsjs.NewWindow(ctx, nt.JS, natsjs.WindowConfig{Stream: name, FromSeq: 4, FilterSubjects: []string{name + ".a"}})
	require.NoError(t, err)
	defer w.Close()
	require.Equal(t, seqRange(4, 9, onA), readWindow(t, w, 1))
}

func TestWindowReceiveAfterCloseIsClosed(t *testing.T) {
	t.Parallel()
	nt, name, _ := windowStream(t, 3)
	w, err := natsjs.NewWindow(context.Background(), nt.JS, natsjs.WindowConfig{Stream: name, FromSeq: 1, FilterSubjects: []string{name + ".none"}})
	require.NoError(t, err)
	_, err = w.Receive(context.Background(), 1)
	require.ErrorIs(t, err, broker.ErrEndOfWindow) // nothing on that subject
	w2, err := natsjs.NewWindow(context.Background(), nt.JS, natsjs.WindowConfig{Stream: name, FromSeq: 1})
	require.NoError(t, err)
	w2.Close()
	w2.Close()
	_, err = w2.Receive(context.Background(), 1)
	require.ErrorIs(t, err, broker.ErrSourceClosed)
}
