package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/sideeffect"
)

// writeJSON writes v as indented JSON. Lists are never null: an empty one
// is [].
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeTable prints header and rows through a tabwriter, or "(none)" when
// there are no rows.
func writeTable(w io.Writer, header string, rows []string) error {
	if len(rows) == 0 {
		_, err := fmt.Fprintln(w, "(none)")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintln(tw, r)
	}
	return tw.Flush()
}

// writeList prints the rows of a list subcommand: as a JSON array, through
// toJSON, when asJSON is set, else as a table under header with line giving
// a row's tab-separated cells.
func writeList[T, J any](w io.Writer, asJSON bool, rows []T, toJSON func([]T) []J, header string, line func(T) string) error {
	if asJSON {
		return writeJSON(w, toJSON(rows))
	}
	lines := make([]string, 0, len(rows))
	for _, r := range rows {
		lines = append(lines, line(r))
	}
	return writeTable(w, header, lines)
}

// payloadJSON holds a payload in JSON output: as JSON when it is JSON, as
// text when it is UTF-8, else as base64.
type payloadJSON struct {
	Payload       json.RawMessage `json:"payload,omitempty"`
	PayloadText   string          `json:"payload_text,omitempty"`
	PayloadBase64 []byte          `json:"payload_base64,omitempty"`
}

func newPayloadJSON(b []byte) payloadJSON {
	switch {
	case len(b) == 0:
		return payloadJSON{}
	case json.Valid(b):
		return payloadJSON{Payload: b}
	case utf8.Valid(b):
		return payloadJSON{PayloadText: string(b)}
	default:
		return payloadJSON{PayloadBase64: b}
	}
}

// effectJSON is a side effect in `effects list --json`.
type effectJSON struct {
	ID             int64      `json:"id"`
	SourceID       string     `json:"source_id"`
	Kind           string     `json:"kind"`
	State          string     `json:"state"`
	IdempotencyKey string     `json:"idempotency_key"`
	Attempts       int        `json:"attempts"`
	NextAttemptAt  *time.Time `json:"next_attempt_at,omitempty"`
	LeaseOwner     string     `json:"lease_owner,omitempty"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at,omitempty"`
	ProviderRef    string     `json:"provider_ref,omitempty"`
	LastError      string     `json:"last_error,omitempty"`
	ResolvedBy     string     `json:"resolved_by,omitempty"`
	ResolutionNote string     `json:"resolution_note,omitempty"`
	ResolvedAt     *time.Time `json:"resolved_at,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	FiredAt        *time.Time `json:"fired_at,omitempty"`
	ConfirmedAt    *time.Time `json:"confirmed_at,omitempty"`
	UpdatedAt      time.Time  `json:"updated_at"`
	payloadJSON
}

func effectsJSON(rows []sideeffect.Row) []effectJSON {
	out := make([]effectJSON, 0, len(rows))
	for _, r := range rows {
		out = append(out, effectJSON{ID: r.ID, SourceID: r.SourceID, Kind: r.Kind, State: string(r.State),
			IdempotencyKey: r.Key, Attempts: r.Attempts, NextAttemptAt: r.NextAttemptAt,
			LeaseOwner: r.LeaseOwner, LeaseExpiresAt: r.LeaseExpiresAt, ProviderRef: r.ProviderRef,
			LastError: r.LastError, ResolvedBy: r.ResolvedBy, ResolutionNote: r.ResolutionNote,
			ResolvedAt: r.ResolvedAt, CreatedAt: r.CreatedAt, FiredAt: r.FiredAt, ConfirmedAt: r.ConfirmedAt,
			UpdatedAt: r.UpdatedAt, payloadJSON: newPayloadJSON(r.Payload)})
	}
	return out
}

// deadLetterJSON is a dead letter in `dlq list --json` and `dlq show --json`.
type deadLetterJSON struct {
	ID         int64               `json:"id"`
	Consumer   string              `json:"consumer"`
	MessageID  string              `json:"message_id"`
	Subject    string              `json:"subject"`
	Headers    map[string][]string `json:"headers"`
	Reason     string              `json:"reason"`
	Attempts   int                 `json:"attempts"`
	CreatedAt  time.Time           `json:"created_at"`
	ReplayedAt *time.Time          `json:"replayed_at,omitempty"`
	payloadJSON
}

func deadLettersJSON(dls []inbox.DeadLetter) []deadLetterJSON {
	out := make([]deadLetterJSON, 0, len(dls))
	for _, dl := range dls {
		h := dl.Headers
		if h == nil {
			h = map[string][]string{}
		}
		out = append(out, deadLetterJSON{ID: dl.ID, Consumer: dl.Consumer, MessageID: dl.MessageID, Subject: dl.Subject,
			Headers: h, Reason: dl.Reason, Attempts: dl.Attempts, CreatedAt: dl.CreatedAt, ReplayedAt: dl.ReplayedAt,
			payloadJSON: newPayloadJSON(dl.Payload)})
	}
	return out
}

// outboxJSON is an outbox row in `outbox list --json`.
type outboxJSON struct {
	Seq           int64             `json:"seq"`
	ID            string            `json:"id"`
	State         string            `json:"state"`
	Partition     int               `json:"partition"`
	Key           string            `json:"ordering_key"`
	Subject       string            `json:"subject"`
	PayloadBytes  *int              `json:"payload_bytes"`
	Headers       map[string]string `json:"headers,omitempty"`
	CreatedAt     time.Time         `json:"created_at"`
	Attempts      int               `json:"attempts"`
	NextAttemptAt *time.Time        `json:"next_attempt_at,omitempty"`
	LastError     string            `json:"last_error,omitempty"`
	ParkedAt      *time.Time        `json:"parked_at,omitempty"`
}

func outboxEntriesJSON(entries []outbox.Entry) []outboxJSON {
	out := make([]outboxJSON, 0, len(entries))
	for _, en := range entries {
		out = append(out, outboxJSON{Seq: en.Seq, ID: en.ID.String(), State: string(en.State()), Partition: en.Partition,
			Key: en.Key, Subject: en.Subject, PayloadBytes: en.PayloadSize, Headers: en.Headers, CreatedAt: en.CreatedAt,
			Attempts: en.Attempts, NextAttemptAt: en.NextAttemptAt, LastError: en.LastError, ParkedAt: en.ParkedAt})
	}
	return out
}

// timestamp formats t for tables.
func timestamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
