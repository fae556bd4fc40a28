package chaos

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Startup-phase request codes of the PostgreSQL frontend protocol: an untyped
// message whose first four bytes after the length are one of these is a
// request, not a StartupMessage.
const (
	pgCancelRequest  = 80877102
	pgSSLRequest     = 80877103
	pgGSSENCRequest  = 80877104
	pgMaxMessageSize = 1 << 30
)

// errPGFraming is returned when bytes from a client do not frame as protocol
// messages.
var errPGFraming = errors.New("chaos: bad PostgreSQL message framing")

// pgMessage is one frontend message: its type byte (0 for the untyped
// startup-phase messages) and its raw bytes, header included, ready to be
// forwarded unchanged.
type pgMessage struct {
	typ byte
	raw []byte
}

// body returns the message's payload after the type byte and the length.
func (m pgMessage) body() []byte {
	if m.typ == 0 {
		return m.raw[4:]
	}
	return m.raw[5:]
}

// readStartupMessage reads an untyped startup-phase message (int32 length,
// then payload) and returns it with its request code.
func readStartupMessage(r io.Reader) (pgMessage, uint32, error) {
	var hdr [8]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return pgMessage{}, 0, err
	}
	n := binary.BigEndian.Uint32(hdr[:4])
	if n < 8 || n > pgMaxMessageSize {
		return pgMessage{}, 0, fmt.Errorf("%w: startup length %d", errPGFraming, n)
	}
	raw := make([]byte, n)
	copy(raw, hdr[:])
	if _, err := io.ReadFull(r, raw[8:]); err != nil {
		return pgMessage{}, 0, err
	}
	return pgMessage{raw: raw}, binary.BigEndian.Uint32(hdr[4:]), nil
}

// readMessage reads one typed message: type byte, int32 length, payload.
func readMessage(r io.Reader) (pgMessage, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return pgMessage{}, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n < 4 || n > pgMaxMessageSize {
		return pgMessage{}, fmt.Errorf("%w: %q length %d", errPGFraming, hdr[0], n)
	}
	raw := make([]byte, 1+n)
	copy(raw, hdr[:])
	if _, err := io.ReadFull(r, raw[5:]); err != nil {
		return pgMessage{}, err
	}
	return pgMessage{typ: hdr[0], raw: raw}, nil
}

// cstrings splits the first n NUL-terminated strings off b; missing ones are
// empty.
func cstrings(b []byte, n int) []string {
	out := make([]string, n)
	for i := range out {
		j := bytes.IndexByte(b, 0)
		if j < 0 {
			out[i] = string(b)
			return out
		}
		out[i], b = string(b[:j]), b[j+1:]
	}
	return out
}

// isCommitSQL reports whether a statement's text commits the transaction:
// COMMIT or END, optionally with WORK or TRANSACTION, in any case, with
// surrounding blanks and a trailing semicolon. pgx's Tx.Commit sends
// "commit" as a simple Query; a Batch (pgx.Batch.Queue("COMMIT")) sends it
// through Parse/Bind/Execute.
func isCommitSQL(sql string) bool {
	sql = strings.TrimSpace(sql)
	sql = strings.TrimSpace(strings.TrimSuffix(sql, ";"))
	switch strings.ToLower(strings.Join(strings.Fields(sql), " ")) {
	case "commit", "commit work", "commit transaction", "end", "end work", "end transaction":
		return true
	}
	return false
}

// commitTracker follows one connection's frontend messages to spot the
// moment a COMMIT is sent: a simple Query of COMMIT, or the Execute of a
// portal bound to a statement whose text is COMMIT (named statements and
// portals are remembered across messages, so a cached prepared COMMIT is
// recognized too).
type commitTracker struct {
	stmts   map[string]bool // prepared statement name → is a COMMIT
	portals map[string]bool // portal name → bound to a COMMIT
}

func newCommitTracker() *commitTracker {
	return &commitTracker{stmts: map[string]bool{}, portals: map[string]bool{}}
}

// commits reports whether m sends a COMMIT to the server. For the extended
// protocol that is the Execute; the server answers once the following Sync
// or Flush arrives.
func (c *commitTracker) commits(m pgMessage) bool {
	b := m.body()
	switch m.typ {
	case 'Q': // Query: text
		return isCommitSQL(cstrings(b, 1)[0])
	case 'P': // Parse: statement name, text, parameter types
		s := cstrings(b, 2)
		c.stmts[s[0]] = isCommitSQL(s[1])
	case 'B': // Bind: portal, statement, …
		s := cstrings(b, 2)
		c.portals[s[0]] = c.stmts[s[1]]
	case 'E': // Execute: portal, max rows
		return c.portals[cstrings(b, 1)[0]]
	case 'C': // Close: 'S' statement or 'P' portal, name
		if len(b) > 0 {
			name := cstrings(b[1:], 1)[0]
			if b[0] == 'S' {
				delete(c.stmts, name)
			} else {
				delete(c.portals, name)
			}
		}
	}
	return false
}
