package outbox

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/broker"
)

// An Outbox with Config.Logical writes each message into the WAL only, as a
// transactional logical decoding message (pg_logical_emit_message) under
// the prefix walPrefix(schema): PostgreSQL decodes it for a LogicalRelay
// when, and only if, the transaction commits, in commit order. Its content
// is walVersion, the ID's 16 bytes, then the key, the subject and the
// headers' JSON (or nothing), each preceded by its length as a uvarint, and
// the payload to the end.

const walVersion = 1

// walPrefix is the prefix of schema's messages in the WAL.
func walPrefix(schema string) string { return "oncekit.outbox." + schema }

// emitSQL writes one message per element of $2, in the array's order.
const emitSQL = `SELECT count(pg_logical_emit_message(true, $1, m)) FROM unnest($2::bytea[]) AS m`

// errWALMessage is what walDecode returns for content it cannot read.
var errWALMessage = errors.New("outbox: undecodable WAL message")

func walEncode(m broker.Message) ([]byte, error) {
	var headers []byte
	if len(m.Headers) > 0 {
		var err error
		if headers, err = json.Marshal(m.Headers); err != nil {
			return nil, fmt.Errorf("outbox: encode headers: %w", err)
		}
	}
	b := make([]byte, 0, 1+16+3*binary.MaxVarintLen32+len(m.Key)+len(m.Subject)+len(headers)+len(m.Payload))
	b = append(b, walVersion)
	b = append(b, m.ID[:]...)
	for _, f := range [][]byte{[]byte(m.Key), []byte(m.Subject), headers} {
		b = binary.AppendUvarint(b, uint64(len(f)))
		b = append(b, f...)
	}
	return append(b, m.Payload...), nil
}

func walDecode(b []byte) (broker.Message, error) {
	var m broker.Message
	if len(b) < 17 || b[0] != walVersion {
		return m, errWALMessage
	}
	m.ID = uuid.UUID(b[1:17])
	b = b[17:]
	var fields [3][]byte
	for i := range fields {
		n, w := binary.Uvarint(b)
		if w <= 0 || n > uint64(len(b)-w) {
			return m, errWALMessage
		}
		fields[i], b = b[w:w+int(n)], b[w+int(n):]
	}
	m.Key, m.Subject = string(fields[0]), string(fields[1])
	if len(fields[2]) > 0 {
		if err := json.Unmarshal(fields[2], &m.Headers); err != nil {
			return m, fmt.Errorf("%w: headers: %v", errWALMessage, err)
		}
	}
	// b is the replication connection's buffer, which its next message
	// overwrites: the payload is copied out (the strings above are).
	m.Payload = bytes.Clone(b)
	if m.Payload == nil {
		m.Payload = []byte{}
	}
	return m, nil
}

// ErrNoSlot is returned by Enqueue with Config.Logical while the slot does
// not exist: what it wrote into the WAL would never be decoded.
var ErrNoSlot = errors.New("outbox: the replication slot does not exist (run SetUpLogical first)")

// enqueueWAL is Enqueue with Config.Logical: every message validated, the
// trace context added, then all written into the WAL in one round trip.
// Until a call has seen the slot, each looks it up first.
func (o *Outbox) enqueueWAL(ctx context.Context, tx pgx.Tx, msgs []broker.Message) (EnqueueResult, error) {
	if !o.slotSeen.Load() {
		var exists bool
		if err := tx.QueryRow(ctx, slotExistsSQL, o.slot).Scan(&exists); err != nil {
			return EnqueueResult{}, fmt.Errorf("outbox: look up the slot: %w", err)
		}
		if !exists {
			return EnqueueResult{}, fmt.Errorf("%w: %s", ErrNoSlot, o.slot)
		}
		o.slotSeen.Store(true)
	}
	tc := o.prop.Inject(ctx)
	contents := make([][]byte, len(msgs))
	for i, m := range msgs {
		if err := validate(i, m, o.maxPayload); err != nil {
			return EnqueueResult{}, err
		}
		if len(tc) > 0 {
			m.Headers = withTrace(m.Headers, tc)
		}
		var err error
		if contents[i], err = walEncode(m); err != nil {
			return EnqueueResult{}, err
		}
	}
	if _, err := tx.Exec(ctx, emitSQL, walPrefix(o.schema), contents); err != nil {
		return EnqueueResult{}, fmt.Errorf("outbox: emit: %w", err)
	}
	return EnqueueResult{Inserted: len(msgs)}, nil
}

// headersJSON is h as the outbox table's headers column takes it: JSON
// text, or nil for none.
func headersJSON(h map[string]string) (*string, error) {
	if len(h) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("outbox: encode headers: %w", err)
	}
	s := string(b)
	return &s, nil
}
