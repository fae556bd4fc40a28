package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/untrusted"
)

// DeadLetter is a row of dead_letters: a message a consumer gave up on. Its
// strings are the message's exact bytes, whatever they hold: a value that a
// text or jsonb column refuses (not valid UTF-8, a NUL byte, an ID wider
// than an index row) is stored made readable in its column and exactly in
// a bytea column beside it, and read back exact.
type DeadLetter struct {
	ID         int64               // the row's identity, as `oncekit dlq` shows it
	Consumer   string              // the consumer (Config.Name) that gave up
	MessageID  string              // as delivered; "" when the message had none
	Subject    string              // where the message was published
	Payload    []byte              // the message body
	Headers    map[string][]string // every header of the delivery
	Reason     string              // why: the handler's error, or a Reason* constant
	Attempts   int                 // delivery attempts made
	CreatedAt  time.Time           // when it was dead-lettered
	ReplayedAt *time.Time          // set once replayed
}

// Caps on what a dead letter's text columns hold of a message from outside.
const (
	// maxIDBytes keeps message_id well inside an index row (about 2,700
	// bytes), so that the pending-message index never refuses one.
	maxIDBytes      = 512
	maxSubjectBytes = 1024
	maxReasonBytes  = 2000
	// maxTermBytes bounds the reason a message terminated at the broker
	// carries (outDropped).
	maxTermBytes = 256
)

// deadKey is the message_id column's value for a raw message ID: the ID
// itself when it is storable and short, else a readable prefix and a hash of
// its bytes. Two raw IDs never share a key, so a message is never taken for
// another's dead letter.
func deadKey(raw string) string { return untrusted.Key(raw, maxIDBytes) }

// deadRow is a DeadLetter as dead_letters holds it.
type deadRow struct {
	messageID, subject, reason string
	headers                    []byte // jsonb
	rawID, rawSubject          []byte // nil when the text column is exact
	rawHeaders                 []byte // rawHeader list as JSON; nil when headers is exact
}

// rawHeader is one header, exact: Go's JSON encodes []byte as base64.
type rawHeader struct {
	Name   []byte   `json:"n"`
	Values [][]byte `json:"v"`
}

// toRow makes dl's strings storable, all at once, and keeps the exact bytes
// of those that changed.
func toRow(dl DeadLetter) (deadRow, error) {
	r := deadRow{
		messageID: deadKey(dl.MessageID),
		subject:   untrusted.Text(dl.Subject, maxSubjectBytes),
		reason:    untrusted.Text(dl.Reason, maxReasonBytes),
	}
	if r.messageID != dl.MessageID {
		r.rawID = []byte(dl.MessageID)
	}
	if r.subject != dl.Subject {
		r.rawSubject = []byte(dl.Subject)
	}
	headers, exact := untrusted.Headers(dl.Headers)
	var err error
	if r.headers, err = json.Marshal(headers); err != nil {
		return r, fmt.Errorf("inbox: dead letter headers: %w", err)
	}
	if !exact {
		names := slices.Sorted(maps.Keys(dl.Headers))
		raw := make([]rawHeader, len(names))
		for i, name := range names {
			raw[i].Name = []byte(name)
			for _, v := range dl.Headers[name] {
				raw[i].Values = append(raw[i].Values, []byte(v))
			}
		}
		if r.rawHeaders, err = json.Marshal(raw); err != nil {
			return r, fmt.Errorf("inbox: dead letter headers: %w", err)
		}
	}
	return r, nil
}

// InsertDeadLetter writes dl (ID, CreatedAt and ReplayedAt are ignored). It
// reports false when a dead letter for the same consumer and message is
// already pending replay (a poison message redelivered because its ack was
// lost), so a message is never dead-lettered twice.
func (s *Store) InsertDeadLetter(ctx context.Context, q oncekit.Querier, dl DeadLetter) (bool, error) {
	r, err := toRow(dl)
	if err != nil {
		return false, err
	}
	if dl.Payload == nil {
		dl.Payload = []byte{}
	}
	tag, err := q.Exec(ctx, s.insertDead, dl.Consumer, r.messageID, r.subject, dl.Payload,
		pgsql.JSON(r.headers), r.reason, dl.Attempts, r.rawID, r.rawSubject, r.rawHeaders)
	if err != nil {
		return false, fmt.Errorf("inbox: insert dead letter: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

func scanDead(row pgx.Row) (DeadLetter, error) {
	var dl DeadLetter
	var headers, rawID, rawSubject, rawHeaders []byte
	err := row.Scan(&dl.ID, &dl.Consumer, &dl.MessageID, &dl.Subject, &dl.Payload, &headers, &dl.Reason, &dl.Attempts,
		&dl.CreatedAt, &dl.ReplayedAt, &rawID, &rawSubject, &rawHeaders)
	if errors.Is(err, pgx.ErrNoRows) {
		return dl, ErrDeadLetterNotFound
	}
	if err != nil {
		return dl, fmt.Errorf("inbox: read dead letter: %w", err)
	}
	if rawID != nil {
		dl.MessageID = string(rawID)
	}
	if rawSubject != nil {
		dl.Subject = string(rawSubject)
	}
	if rawHeaders == nil {
		if err := json.Unmarshal(headers, &dl.Headers); err != nil {
			return dl, fmt.Errorf("inbox: dead letter %d headers: %w", dl.ID, err)
		}
		return dl, nil
	}
	var raw []rawHeader
	if err := json.Unmarshal(rawHeaders, &raw); err != nil {
		return dl, fmt.Errorf("inbox: dead letter %d raw headers: %w", dl.ID, err)
	}
	dl.Headers = make(map[string][]string, len(raw))
	for _, h := range raw {
		vs := make([]string, len(h.Values))
		for i, v := range h.Values {
			vs[i] = string(v)
		}
		dl.Headers[string(h.Name)] = vs
	}
	return dl, nil
}

// Recorded says what RecordDeadLetter wrote for a message.
type Recorded int

const (
	// RecordedWhole: the dead letter as given, or one already pending for
	// the message.
	RecordedWhole Recorded = iota
	// RecordedMinimal: PostgreSQL refused the dead letter, and its minimal
	// record (consumer, ID, payload, attempts and why the rest is missing)
	// stands for it.
	RecordedMinimal
	// RecordedNothing: PostgreSQL refused the minimal record too. The caller
	// can only drop the message (terminate it at the broker) and log it.
	RecordedNothing
)

// RecordDeadLetter writes dl as InsertDeadLetter does and, when PostgreSQL
// refuses the row for what it holds (pgsql class 22 or 54, a CHECK), the
// message's minimal record instead. In a transaction (q a pgx.Tx) each
// insert runs under a savepoint of its own, so that a refused row fails
// alone and the transaction goes on. An error is a failure other than a
// refusal (a lost connection, a missing table), which a later attempt may
// cure; refusal is then nil. Otherwise refusal is why the whole dead letter
// was not written, if it was not.
func (s *Store) RecordDeadLetter(ctx context.Context, q oncekit.Querier, dl DeadLetter) (rec Recorded, refusal, err error) {
	insert := func(dl DeadLetter) (err error) {
		on, sp := q, pgx.Tx(nil)
		if tx, ok := q.(pgx.Tx); ok {
			if sp, err = tx.Begin(ctx); err != nil {
				return fmt.Errorf("inbox: dead letter savepoint: %w", err)
			}
			on = sp
		}
		_, err = s.InsertDeadLetter(ctx, on, dl)
		switch {
		case sp == nil:
			return err
		case err != nil:
			if rerr := sp.Rollback(ctx); rerr != nil {
				return fmt.Errorf("inbox: dead letter savepoint: %w", rerr)
			}
			return err
		}
		return sp.Commit(ctx)
	}
	if err = insert(dl); !pgsql.Refused(err) {
		return RecordedWhole, nil, err
	}
	refusal = err
	// What is left of dl when PostgreSQL refused its row: its consumer, ID,
	// payload and attempts, and why the rest is missing (the reason made
	// storable, within maxReasonBytes, with the row).
	minimal := DeadLetter{
		Consumer: dl.Consumer, MessageID: dl.MessageID, Payload: dl.Payload, Attempts: dl.Attempts,
		Reason: fmt.Sprintf("dead letter refused by PostgreSQL (%v); kept without subject and headers; reason: %s", refusal, dl.Reason),
	}
	if err = insert(minimal); !pgsql.Refused(err) {
		return RecordedMinimal, refusal, err
	}
	return RecordedNothing, refusal, nil
}

// The dead letters of a batch's messages, each made storable at once
// (toRow), are written by its commit stage (commitTx): in the transaction,
// or on its own for a message that ran alone.

// recordDead writes, on q, the dead letter of each message of items whose
// outcome is outDead, in order (RecordDeadLetter), and logs a refusal. A
// message for which no row stands (PostgreSQL refused its minimal record
// too) becomes outDropped: it is to be terminated at the broker, with its
// reason made readable and short (maxTermBytes). An error
// is a failure other than a refusal, and stops at its message.
func (c *Consumer) recordDead(ctx context.Context, q oncekit.Querier, items []*item, out []outcome) error {
	for i, it := range items {
		if out[i].kind != outDead {
			continue
		}
		dl := c.deadLetter(it, out[i].reason)
		rec, refusal, err := c.store.RecordDeadLetter(ctx, q, dl)
		switch {
		case err != nil:
			return err
		case rec == RecordedMinimal:
			c.logger(it).Warn("inbox dead letter refused by PostgreSQL; recorded a minimal one", "err", refusal)
		case rec == RecordedNothing:
			c.logger(it).Error("inbox dead letter refused by PostgreSQL, minimal one too; terminating the message at the broker",
				"err", refusal, "reason", untrusted.Text(dl.Reason, maxReasonBytes))
			out[i].kind, out[i].term = outDropped, untrusted.Text(dl.Reason, maxTermBytes)
		}
	}
	return nil
}

// deadLetter is the dead letter of it, for reason.
func (c *Consumer) deadLetter(it *item, reason string) DeadLetter {
	return DeadLetter{
		Consumer: c.cfg.Name, MessageID: it.rawID, Subject: it.d.Subject(), Payload: it.d.Data(),
		Headers: it.d.Headers(), Reason: reason, Attempts: it.attempt,
	}
}
