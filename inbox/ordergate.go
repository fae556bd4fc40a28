package inbox

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
)

// Floor refreshes: at least this often, to forget settled messages of
// other processes; at most this often when a held message waits on one.
const (
	floorRefresh     = time.Second
	floorRefreshWait = 100 * time.Millisecond
)

// orderGate keeps ordered mode's per-key order across processes and
// crashes. It knows every message of the source above the ack floor that
// has a key and is not known to have taken effect (pending), so it sees the
// messages another process (or this one before a restart) received and has
// not settled. A message may run when no pending message of its key comes
// before it, other than those running before it in its own batch. A pending
// message is forgotten when this process settles it, when the database
// shows its claim (or its dead letter), or when the ack floor passes it.
//
// It knows a delivered message (first delivery or not) from the delivery,
// and reads the rest of the log (before the first delivery, between two
// delivered sequences: what other processes received, or messages of
// other subjects) with OrderedSource.Scan. It infers nothing from the
// numbering of deliveries, which a consumer leader change can break (a new
// leader whose state lags numbers them again), and a scan that stops
// before the sequence asked for proves nothing past where it stopped: the
// gate holds the batch and reads again.
type orderGate struct {
	src   broker.OrderedSource
	db    oncekit.DB
	store *Store
	name  string
	log   *slog.Logger

	scanMu sync.Mutex // one Scan at a time, in sequence order

	mu      sync.Mutex
	floor   uint64    // every message at or below it is acknowledged
	floorAt time.Time // when floor was read
	known   uint64    // every message up to it is known (in pending, or settled)
	spans   []span    // delivered sequences past known, in order
	keys    map[string][]uint64
	pending map[uint64]pendingMsg
}

// span is a range of the log's sequences whose messages are all known.
type span struct{ from, to uint64 }

// pendingMsg is a message above the floor not known to have taken effect.
type pendingMsg struct {
	key string
	raw string    // its ID as delivered
	id  uuid.UUID // uuid.Nil when raw is not one
}

func newOrderGate(src broker.OrderedSource, db oncekit.DB, store *Store, name string, log *slog.Logger) *orderGate {
	return &orderGate{src: src, db: db, store: store, name: name, log: log,
		keys: map[string][]uint64{}, pending: map[uint64]pendingMsg{}}
}

// admit splits a lane's batch (in sequence order) into the messages that
// may run now and those held back behind an earlier message of their key.
// When it cannot tell (the source or the database failed), it holds.
func (g *orderGate) admit(ctx context.Context, items []*item) (run, held []*item) {
	var top uint64
	for _, it := range items {
		top = max(top, it.seq)
	}
	if err := g.scanTo(ctx, top); err != nil {
		g.log.Warn("inbox ordered: cannot read the source's earlier messages; holding the batch", "err", err)
		return nil, items
	}
	ok, waits := g.check(items)
	if len(waits) > 0 {
		g.resolve(ctx, waits)
		ok, _ = g.check(items)
	} else if g.floorAge() > floorRefresh {
		g.refreshFloor(ctx)
	}
	for i, it := range items {
		if ok[i] {
			run = append(run, it)
		} else {
			held = append(held, it)
		}
	}
	return run, held
}

// check reports which items may run, and the pending messages that hold
// back the others.
func (g *orderGate) check(items []*item) (ok []bool, waits map[uint64]pendingMsg) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ok = make([]bool, len(items))
	heldKeys := map[string]bool{}
	running := map[uint64]bool{} // earlier in this batch, and running
	for i, it := range items {
		if it.key == "" || it.seq == 0 {
			ok[i] = true
			continue
		}
		if heldKeys[it.key] {
			continue
		}
		ok[i] = true
		for _, seq := range g.keys[it.key] {
			if seq >= it.seq {
				break
			}
			if !running[seq] {
				ok[i] = false
				if waits == nil {
					waits = map[uint64]pendingMsg{}
				}
				waits[seq] = g.pending[seq]
			}
		}
		if ok[i] {
			running[it.seq] = true
		} else {
			heldKeys[it.key] = true
		}
	}
	return ok, waits
}

// resolve forgets the messages of waits that took effect (a claim or a
// dead letter in the database), and reads the ack floor again if some
// still wait and it was not read just now.
func (g *orderGate) resolve(ctx context.Context, waits map[uint64]pendingMsg) {
	var ids []uuid.UUID
	var raws []string
	for _, p := range waits {
		if p.id != uuid.Nil {
			ids = append(ids, p.id)
		}
		raws = append(raws, p.raw)
	}
	done, err := g.store.settledOf(ctx, g.db, g.name, ids, raws)
	if err != nil {
		g.log.Warn("inbox ordered: cannot read earlier messages' claims", "err", err)
	}
	left := 0
	g.mu.Lock()
	for seq, p := range waits {
		if done[p.raw] || (p.id != uuid.Nil && done[p.id.String()]) {
			g.forgetLocked(seq)
		} else {
			left++
		}
	}
	g.mu.Unlock()
	if left > 0 && g.floorAge() > floorRefreshWait {
		g.refreshFloor(ctx)
	}
}

// settled forgets a message this process settled (acked after its commit).
func (g *orderGate) settled(it *item) {
	if it.seq == 0 {
		return
	}
	g.mu.Lock()
	g.forgetLocked(it.seq)
	g.mu.Unlock()
}

func (g *orderGate) forgetLocked(seq uint64) {
	p, ok := g.pending[seq]
	if !ok {
		return
	}
	delete(g.pending, seq)
	seqs := g.keys[p.key]
	if i, found := slices.BinarySearch(seqs, seq); found {
		seqs = slices.Delete(seqs, i, i+1)
	}
	if len(seqs) == 0 {
		delete(g.keys, p.key)
	} else {
		g.keys[p.key] = seqs
	}
}

// firstPending describes, for a log line, the earliest pending message of
// key (seq 0: none) and the ack floor as last read.
func (g *orderGate) firstPending(key string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	first := uint64(0)
	if seqs := g.keys[key]; len(seqs) > 0 {
		first = seqs[0]
	}
	return fmt.Sprintf("seq %d (ack floor %d, read %s ago)", first, g.floor, time.Since(g.floorAt).Round(time.Second))
}

func (g *orderGate) floorAge() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return time.Since(g.floorAt)
}

// refreshFloor reads the ack floor and forgets what it passed.
func (g *orderGate) refreshFloor(ctx context.Context) {
	floor, err := g.src.AckFloor(ctx)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.floorAt = time.Now()
	if err != nil {
		g.log.Warn("inbox ordered: cannot read the ack floor", "err", err)
		return
	}
	if floor <= g.floor {
		return
	}
	g.floor = floor
	for seq := range g.pending {
		if seq <= floor {
			g.forgetLocked(seq)
		}
	}
}

// start reads the ack floor: the messages above it are not known yet.
func (g *orderGate) start(ctx context.Context) error {
	floor, err := g.src.AckFloor(ctx)
	if err != nil {
		return fmt.Errorf("inbox: ordered: read the ack floor: %w", err)
	}
	g.scanMu.Lock()
	_, err = g.src.Scan(ctx, floor+1, floor)
	g.scanMu.Unlock()
	if err != nil {
		return fmt.Errorf("%w: cannot read the source's log: %w", ErrOrderUnsupported, err)
	}
	g.mu.Lock()
	g.floor, g.floorAt, g.known = floor, time.Now(), floor
	g.mu.Unlock()
	return nil
}

// observe learns from deliveries as they are received: a delivered
// message is known (its key and sequence), first delivery or not, and a
// range of sequences all delivered to this process needs no reading.
func (g *orderGate) observe(items []*item) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, it := range items {
		if it.seq == 0 || it.seq <= g.known {
			continue
		}
		g.addLocked(it.seq, it.key, it.rawID)
		g.spans = addSpan(g.spans, it.seq)
	}
}

// addSpan adds seq to spans (sorted, disjoint, not adjacent).
func addSpan(spans []span, seq uint64) []span {
	i, _ := slices.BinarySearchFunc(spans, seq, func(s span, seq uint64) int {
		switch {
		case s.to < seq:
			return -1
		case s.from > seq:
			return 1
		}
		return 0
	})
	// spans[i] is the first span not wholly before seq.
	if i < len(spans) && spans[i].from <= seq {
		return spans // already in it
	}
	switch before, after := i > 0 && spans[i-1].to+1 == seq, i < len(spans) && spans[i].from == seq+1; {
	case before && after:
		spans[i-1].to = spans[i].to
		return slices.Delete(spans, i, i+1)
	case before:
		spans[i-1].to = seq
	case after:
		spans[i].from = seq
	default:
		return slices.Insert(spans, i, span{seq, seq})
	}
	return spans
}

// nextSpanLocked merges into known the spans that reach it, and returns
// the start of the next one past it (0: none).
func (g *orderGate) nextSpanLocked() uint64 {
	for len(g.spans) > 0 && g.spans[0].from <= g.known+1 {
		g.known = max(g.known, g.spans[0].to)
		g.spans = g.spans[1:]
	}
	if len(g.spans) > 0 {
		return g.spans[0].from
	}
	return 0
}

// scanTo makes every message up to sequence to known, reading from the
// log what the deliveries did not show.
func (g *orderGate) scanTo(ctx context.Context, to uint64) error {
	g.scanMu.Lock()
	defer g.scanMu.Unlock()
	for {
		g.mu.Lock()
		g.known = max(g.known, g.floor) // at or below the floor, all settled
		next := g.nextSpanLocked()
		from := g.known + 1
		g.mu.Unlock()
		if to < from {
			return nil
		}
		upTo, accept := to, uint64(math.MaxUint64)
		if next != 0 {
			upTo, accept = min(to, next-1), next-1
		}
		msgs, err := g.src.Scan(ctx, from, upTo)
		if err != nil {
			return err
		}
		// Known is what the scan read: up to upTo only if it read that
		// far. A scan that stopped short (the messages were deleted, or
		// the reader believed so) proves nothing past its last message.
		read := uint64(0)
		if n := len(msgs); n > 0 {
			read = msgs[n-1].Sequence
		}
		g.mu.Lock()
		high := min(read, upTo)
		for _, m := range msgs {
			if m.Sequence < from || m.Sequence > accept {
				continue
			}
			high = max(high, m.Sequence)
			key, raw := identity(func(name string) string {
				if v := m.Headers[name]; len(v) > 0 {
					return v[0]
				}
				return ""
			})
			g.addLocked(m.Sequence, key, raw)
		}
		g.known = max(g.known, high)
		g.mu.Unlock()
		if read < upTo {
			return fmt.Errorf("inbox: ordered: read the source's log from %d to %d only up to %d", from, upTo, read)
		}
	}
}

// addLocked records a message above the floor as pending, once.
func (g *orderGate) addLocked(seq uint64, key, raw string) {
	if key == "" || seq <= g.floor {
		return
	}
	if _, ok := g.pending[seq]; ok {
		return
	}
	p := pendingMsg{key: key, raw: raw}
	if id, err := uuid.Parse(raw); err == nil {
		p.id = id
	}
	g.pending[seq] = p
	seqs := g.keys[key]
	if n := len(seqs); n == 0 || seqs[n-1] < seq {
		g.keys[key] = append(seqs, seq)
		return
	}
	i, _ := slices.BinarySearch(seqs, seq)
	g.keys[key] = slices.Insert(seqs, i, seq)
}

// identity returns a message's ordering key and its ID as delivered: the
// event's own ID first, as a copy republished under a fresh Nats-Msg-Id
// keeps it.
func identity(header func(name string) string) (key, raw string) {
	raw = header(broker.HeaderEventID)
	if raw == "" {
		raw = header(broker.HeaderMsgID)
	}
	return header(broker.HeaderKey), raw
}
