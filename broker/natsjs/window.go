package natsjs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/broker"
)

// WindowConfig selects a stretch of a stream for a Window: from a sequence
// or a time, to a sequence or a time, on some of its subjects.
type WindowConfig struct {
	// Stream the window reads. Required.
	Stream string
	// FilterSubjects restricts the window to these subjects (the durable
	// consumer's, to replay what it was delivered). Each must lie within
	// the stream's subjects. Defaults to every subject of the stream.
	FilterSubjects []string
	// FromSeq is the stream sequence the window starts at. Exactly one of
	// FromSeq and FromTime is required.
	FromSeq uint64
	// FromTime is the time the window starts at: its first message is the
	// first one the stream stored at or after it.
	FromTime time.Time
	// ToSeq is the last stream sequence of the window. Defaults to the
	// stream's last sequence when the window is opened: a message published
	// later is never waited for. A later ToSeq is lowered to it.
	ToSeq uint64
	// ToTime ends the window before the first message stored after it.
	// At most one of ToSeq and ToTime may be set.
	ToTime time.Time
}

// Errors of NewWindow. Each names what was asked and what the stream holds.
var (
	// ErrInvalidWindow: no start, two starts or two ends, or a start after
	// the end.
	ErrInvalidWindow = errors.New("natsjs: invalid window")
	// ErrWindowInFuture: the window starts after the stream's last message
	// (FromSeq) or after now (FromTime).
	ErrWindowInFuture = errors.New("natsjs: window starts in the future")
	// ErrWindowGone: the stream no longer holds the start of the window
	// (see WindowGoneError).
	ErrWindowGone = errors.New("natsjs: the stream no longer holds the window's start")
	// ErrStreamNotFound: there is no such stream. It is joined with
	// jetstream.ErrStreamNotFound.
	ErrStreamNotFound = errors.New("natsjs: stream not found")
	// ErrSubjectNotInStream: a FilterSubjects entry lies outside the
	// stream's subjects, so the stream holds no message on it.
	ErrSubjectNotInStream = errors.New("natsjs: subject not in stream")
)

// WindowGoneError is ErrWindowGone with what was asked and what is left:
// the stream's retention (MaxAge, MaxMsgs, MaxBytes, or a purge) dropped
// the messages before its first one, so those of the window among them
// cannot be read, and nothing can replay them.
type WindowGoneError struct {
	Stream    string
	FromSeq   uint64    // the window's start, when by sequence
	FromTime  time.Time // the window's start, when by time
	FirstSeq  uint64    // the stream's first message now
	FirstTime time.Time // when it was stored
}

// Error says what was asked and what the stream holds.
func (e *WindowGoneError) Error() string {
	from := fmt.Sprintf("sequence %d", e.FromSeq)
	if e.FromSeq == 0 {
		from = e.FromTime.UTC().Format(time.RFC3339Nano)
	}
	return fmt.Sprintf("natsjs: window of stream %s starts at %s, but the stream's first message is now sequence %d (%s): "+
		"its retention dropped the earlier ones, which cannot be replayed; start at sequence %d to replay what is left",
		e.Stream, from, e.FirstSeq, e.FirstTime.UTC().Format(time.RFC3339Nano), e.FirstSeq)
}

// Is reports ErrWindowGone.
func (e *WindowGoneError) Is(target error) bool { return target == ErrWindowGone }

// windowIdle is how long Receive waits for the next message of the window
// (which the stream holds) before it gives up with an error.
const windowIdle = 30 * time.Second

// Window is a broker.Window over a JetStream stream: an ordered consumer of
// its own (ephemeral, in memory, no acks), so reading it neither moves nor
// disturbs the durable consumers, which may run meanwhile. It reads the
// stretch of the stream WindowConfig selects, as the stream holds it when
// NewWindow returns, and then ends. Receive is not for concurrent use;
// Close releases the ordered consumer.
//
// It is a broker.Window rather than a Source of the durable's kind because
// what it delivers was acknowledged long ago: there is no redelivery to lean
// on, so its reader (inbox.Consumer.ReplayWindow) retries in place, and its
// settlement calls are no-ops. A work-queue stream, which allows no second
// consumer on a subject, cannot be read so.
type Window struct {
	js     jetstream.JetStream
	cfg    WindowConfig
	last   uint64 // the window's last sequence
	cc     jetstream.ConsumeContext
	msgs   chan jetstream.Msg
	stop   chan struct{}
	oc     jetstream.Consumer
	close  sync.Once
	ended  bool
	idle   time.Duration
	filter []string // what to ask the stream for when the consumer says nothing follows
}

var _ broker.Window = (*Window)(nil)

// NewWindow checks cfg against the stream and opens the window. Its errors
// wrap ErrInvalidWindow, ErrWindowInFuture, ErrWindowGone (a
// *WindowGoneError), ErrStreamNotFound or ErrSubjectNotInStream.
func NewWindow(ctx context.Context, js jetstream.JetStream, cfg WindowConfig) (*Window, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: NewWindow: nil JetStream", ErrInvalidConfig)
	}
	if err := cfg.validate(time.Now()); err != nil {
		return nil, err
	}
	st, err := js.Stream(ctx, cfg.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("%w: %s: %w", ErrStreamNotFound, cfg.Stream, err)
	}
	if err != nil {
		return nil, fmt.Errorf("natsjs: window: stream %s: %w", cfg.Stream, err)
	}
	info := st.CachedInfo()
	if err := subjectsWithin(cfg.Stream, cfg.FilterSubjects, info.Config.Subjects); err != nil {
		return nil, err
	}
	state := info.State
	last := state.LastSeq
	if cfg.ToSeq > 0 {
		last = min(last, cfg.ToSeq)
	}
	gone := &WindowGoneError{Stream: cfg.Stream, FromSeq: cfg.FromSeq, FromTime: cfg.FromTime,
		FirstSeq: state.FirstSeq, FirstTime: state.FirstTime}
	switch {
	case cfg.FromSeq > state.LastSeq:
		return nil, fmt.Errorf("%w: sequence %d of stream %s, whose last message is sequence %d",
			ErrWindowInFuture, cfg.FromSeq, cfg.Stream, state.LastSeq)
	case cfg.FromSeq > 0 && cfg.FromSeq < state.FirstSeq:
		return nil, gone
	case !cfg.FromTime.IsZero() && state.FirstSeq > 1 && cfg.FromTime.Before(state.FirstTime):
		// Something was dropped, and the first message left is later
		// than the start: the dropped ones may have been in the window.
		return nil, gone
	}
	w := &Window{js: js, cfg: cfg, last: last, idle: windowIdle, filter: cfg.FilterSubjects, stop: make(chan struct{})}
	if len(w.filter) == 0 {
		w.filter = []string{">"}
	}
	occ := jetstream.OrderedConsumerConfig{FilterSubjects: cfg.FilterSubjects}
	if cfg.FromSeq > 0 {
		occ.DeliverPolicy, occ.OptStartSeq = jetstream.DeliverByStartSequencePolicy, cfg.FromSeq
	} else {
		from := cfg.FromTime
		occ.DeliverPolicy, occ.OptStartTime = jetstream.DeliverByStartTimePolicy, &from
	}
	if last == 0 {
		w.ended = true // an empty stream
		return w, nil
	}
	oc, err := js.OrderedConsumer(ctx, cfg.Stream, occ)
	if err != nil {
		return nil, fmt.Errorf("natsjs: window on %s: %w", cfg.Stream, err)
	}
	w.msgs, w.oc = make(chan jetstream.Msg, 256), oc
	w.cc, err = oc.Consume(func(m jetstream.Msg) {
		select {
		case w.msgs <- m:
		case <-w.stop:
		}
	})
	if err != nil {
		return nil, fmt.Errorf("natsjs: window on %s: %w", cfg.Stream, err)
	}
	if ci := oc.CachedInfo(); ci != nil && ci.NumPending == 0 {
		w.end() // no message on the subjects from the start on
	}
	return w, nil
}

func (c *WindowConfig) validate(now time.Time) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidWindow, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Stream == "":
		return bad("Stream is required")
	case c.FromSeq == 0 && c.FromTime.IsZero():
		return bad("a start is required: FromSeq or FromTime")
	case c.FromSeq > 0 && !c.FromTime.IsZero():
		return bad("FromSeq %d and FromTime %s: give one start", c.FromSeq, c.FromTime.Format(time.RFC3339Nano))
	case c.ToSeq > 0 && !c.ToTime.IsZero():
		return bad("ToSeq %d and ToTime %s: give at most one end", c.ToSeq, c.ToTime.Format(time.RFC3339Nano))
	case c.ToSeq > 0 && c.FromSeq > c.ToSeq:
		return bad("FromSeq %d is after ToSeq %d", c.FromSeq, c.ToSeq)
	case !c.ToTime.IsZero() && !c.FromTime.IsZero() && c.FromTime.After(c.ToTime):
		return bad("FromTime %s is after ToTime %s", c.FromTime.Format(time.RFC3339Nano), c.ToTime.Format(time.RFC3339Nano))
	case c.FromTime.After(now):
		return fmt.Errorf("%w: FromTime %s is after now (%s)", ErrWindowInFuture,
			c.FromTime.UTC().Format(time.RFC3339Nano), now.UTC().Format(time.RFC3339Nano))
	}
	for _, f := range c.FilterSubjects {
		if f == "" {
			return bad("an empty FilterSubjects entry")
		}
	}
	return nil
}

// subjectsWithin returns ErrSubjectNotInStream for the first filter outside
// every subject of the stream. A stream without subjects of its own (a
// mirror, or one that only sources others) is not checked.
func subjectsWithin(stream string, filters, subjects []string) error {
	if len(subjects) == 0 {
		return nil
	}
	for _, f := range filters {
		in := false
		for _, s := range subjects {
			if subjectWithin(f, s) {
				in = true
				break
			}
		}
		if !in {
			return fmt.Errorf("%w: %q is not within the subjects of stream %s (%s)",
				ErrSubjectNotInStream, f, stream, strings.Join(subjects, ", "))
		}
	}
	return nil
}

// subjectWithin reports whether every subject filter f matches also matches
// pattern p (NATS wildcards: * one token, > the rest).
func subjectWithin(f, p string) bool {
	ft, pt := strings.Split(f, "."), strings.Split(p, ".")
	for i, t := range pt {
		if t == ">" {
			return i < len(ft)
		}
		if i >= len(ft) {
			return false
		}
		switch {
		case ft[i] == ">":
			return false
		case t == "*":
		case t != ft[i]:
			return false
		}
	}
	return len(ft) == len(pt)
}

// Last implements broker.Window: the window's last stream sequence.
func (w *Window) Last() uint64 { return w.last }

// Receive implements broker.Window. It returns an error, not a wait without
// end, if the stream delivers nothing for 30 s while the window is not
// read to its end.
func (w *Window) Receive(ctx context.Context, max int) ([]broker.Delivery, error) {
	if w.ended {
		return nil, broker.ErrEndOfWindow
	}
	select {
	case <-w.stop:
		return nil, broker.ErrSourceClosed
	default:
	}
	idle := time.NewTimer(w.idle)
	defer idle.Stop()
	var out []broker.Delivery
	for len(out) < max && !w.ended {
		var m jetstream.Msg
		if len(out) == 0 {
			select {
			case m = <-w.msgs:
			case <-idle.C:
				return nil, fmt.Errorf("natsjs: window on %s: no message for %s while reading up to sequence %d",
					w.cfg.Stream, w.idle, w.last)
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-w.stop:
				return nil, broker.ErrSourceClosed
			}
		} else {
			select {
			case m = <-w.msgs:
			default:
				return out, nil
			}
		}
		keep, err := w.take(ctx, m)
		if err != nil {
			return nil, err
		}
		if keep {
			out = append(out, windowDelivery{delivery{m}})
		}
	}
	if len(out) == 0 {
		return nil, broker.ErrEndOfWindow
	}
	return out, nil
}

// take decides whether m belongs to the window, and ends the window after
// its last message.
func (w *Window) take(ctx context.Context, m jetstream.Msg) (bool, error) {
	md, err := m.Metadata()
	if err != nil {
		return false, fmt.Errorf("natsjs: window on %s: %w", w.cfg.Stream, err)
	}
	seq := md.Sequence.Stream
	if seq > w.last || (!w.cfg.ToTime.IsZero() && md.Timestamp.After(w.cfg.ToTime)) {
		w.end()
		return false, nil
	}
	if seq == w.last {
		w.end()
		return true, nil
	}
	if md.NumPending == 0 {
		// Nothing more on the window's subjects, says the server the
		// consumer reads, which may be a replica behind the stream:
		// only the stream's leader can tell.
		more, err := w.moreAfter(ctx, seq)
		if err != nil {
			return false, err
		}
		if !more {
			w.end()
		}
	}
	return true, nil
}

// moreAfter asks the stream whether a message of the window follows seq.
func (w *Window) moreAfter(ctx context.Context, seq uint64) (bool, error) {
	st, err := w.js.Stream(ctx, w.cfg.Stream)
	if err != nil {
		return false, fmt.Errorf("natsjs: window on %s: %w", w.cfg.Stream, err)
	}
	for _, f := range w.filter {
		m, err := st.GetMsg(ctx, seq+1, jetstream.WithGetMsgSubject(f))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("natsjs: window on %s: %w", w.cfg.Stream, err)
		}
		if m.Sequence <= w.last {
			return true, nil
		}
	}
	return false, nil
}

func (w *Window) end() {
	w.ended = true
	w.Close()
}

// Close releases the window's ordered consumer; a Receive after it (or
// waiting meanwhile) returns broker.ErrSourceClosed unless the window was
// read to its end. It is safe to call more than once, from any goroutine.
func (w *Window) Close() {
	w.close.Do(func() {
		close(w.stop)
		if w.cc == nil {
			return
		}
		w.cc.Stop()
		// The server would delete it after 5 minutes without a reader.
		if ci := w.oc.CachedInfo(); ci != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = w.js.DeleteConsumer(ctx, w.cfg.Stream, ci.Name)
		}
	})
}

// windowDelivery is a message of a Window: read, not consumed, so there is
// nothing to settle at the broker.
type windowDelivery struct{ delivery }

func (windowDelivery) Ack(context.Context) error                { return nil }
func (windowDelivery) Nak(context.Context, time.Duration) error { return nil }
func (windowDelivery) InProgress(context.Context) error         { return nil }
func (windowDelivery) Term(context.Context, string) error       { return nil }

// Attempt is 1: the window delivers each message once.
func (windowDelivery) Attempt() int { return 1 }
