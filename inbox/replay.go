package inbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
)

// ErrNoReplayID is returned when replaying a dead letter whose message had
// no valid ID, unless ReplayOptions.AssignID is set.
var ErrNoReplayID = errors.New("inbox: dead letter has no valid message id")

// ErrReplayDeduped is returned when the broker dropped the replayed message
// as a duplicate: its dedup window (JetStream's stream Duplicates) still
// remembers the original ID. Nothing was changed; replay once the window has
// passed.
var ErrReplayDeduped = errors.New("inbox: the broker's dedup window still holds this message ID; replay after the window has passed")

// ReplayOptions tunes Replay.
type ReplayOptions struct {
	// AssignID gives a message that arrived without a valid ID the
	// deterministic ID DeriveID("oncekit.dead-letter", consumer, row ID), so
	// replaying it twice still dedups. Without it such a replay fails with
	// ErrNoReplayID.
	AssignID bool
}

// Replay republishes dead letter id through pub, the publisher of the broker
// the consumer reads (a natsjs.Publisher for JetStream, a asbroker.Publisher
// for RabbitMQ, Redis Streams or any other watermill Pub/Sub), to the
// subject it was delivered on, with its original message ID
// (so consumers that did process it absorb it as a duplicate, and the one
// that dead-lettered it processes it once), then marks it replayed. The row
// stays locked while publishing: if the publish fails nothing changes, and a
// consumer that fails the replayed message again writes a new dead letter
// instead of colliding with this one. It returns the row as replayed.
//
// A broker that dedups on the ID (JetStream within its stream's Duplicates
// window) drops a replay of a message it stored recently: Replay then fails
// with ErrReplayDeduped and changes nothing.
func (s *Store) Replay(ctx context.Context, db oncekit.Beginner, pub broker.Publisher, id int64, opts ReplayOptions) (DeadLetter, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return DeadLetter{}, fmt.Errorf("inbox: replay dead letter %d: begin: %w", id, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // no-op after Commit
	dl, err := scanDead(tx.QueryRow(ctx, s.markReplayed, id))
	if err != nil {
		return dl, err
	}
	msg, err := replayMessage(dl, opts)
	if err != nil {
		return dl, err
	}
	res := pub.Publish(ctx, []broker.Message{msg})
	if len(res) != 1 || res[0].Err != nil {
		if len(res) == 1 {
			err = res[0].Err
		}
		return dl, fmt.Errorf("inbox: replay dead letter %d: publish: %w", id, err)
	}
	if res[0].Duplicate {
		return dl, fmt.Errorf("%w (dead letter %d, message %s)", ErrReplayDeduped, id, msg.ID)
	}
	if err := tx.Commit(ctx); err != nil {
		return dl, fmt.Errorf("inbox: replay dead letter %d: commit: %w", id, err)
	}
	return dl, nil
}

// replayMessage rebuilds the broker message of a dead letter: original ID,
// subject, key, payload and application headers (the broker's own Nats-*
// headers are dropped).
func replayMessage(dl DeadLetter, opts ReplayOptions) (broker.Message, error) {
	id, err := uuid.Parse(dl.MessageID)
	if err != nil || id == uuid.Nil {
		if !opts.AssignID {
			return broker.Message{}, fmt.Errorf("%w (dead letter %d, id %q); replay with AssignID", ErrNoReplayID, dl.ID, dl.MessageID)
		}
		id = oncekit.DeriveID("oncekit.dead-letter", dl.Consumer, strconv.FormatInt(dl.ID, 10))
	}
	m := broker.Message{ID: id, Subject: dl.Subject, Payload: dl.Payload, Headers: map[string]string{}}
	for k, vs := range dl.Headers {
		if len(vs) == 0 || strings.HasPrefix(strings.ToLower(k), "nats-") {
			continue
		}
		switch k {
		case broker.HeaderEventID:
			continue
		case broker.HeaderKey:
			m.Key = vs[0]
			continue
		}
		m.Headers[k] = vs[0]
	}
	return m, nil
}
