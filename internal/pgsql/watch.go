package pgsql

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit"
)

// ErrStatementBroken is wrapped by a Watch's Err: a statement of the
// daemon's loop fails in a way sending it again cannot cure (Broken).
var ErrStatementBroken = oncekit.ErrStatementBroken

// WatchLogInterval is how often a Watch logs a cause that persists.
const WatchLogInterval = time.Minute

// maxCauseBytes bounds the error text a Watch logs and reports.
const maxCauseBytes = 300

// Watch keeps a daemon's view of the statements of its loop that cannot
// succeed as sent. The daemon goes on backing off and retrying them (a
// grant given back, a column restored or a pooler setting fixed cures
// them); the Watch makes them loud instead of a warning per message: each
// distinct cause is logged at error level when first seen and then at most
// once per WatchLogInterval (with the failures in between), counted, and
// reported by Err until the statement succeeds again. The zero value is not
// usable; NewWatch makes one. It is safe for concurrent use.
type Watch struct {
	log      *slog.Logger
	count    func(statement, class string)
	interval time.Duration
	now      func() time.Time

	mu     sync.Mutex
	failed map[string]*cause    // by statement
	logged map[string]time.Time // by statement and cause: its last error line
}

// cause is a statement's current failure.
type cause struct {
	key      string // SQLSTATE or error text: what makes a cause distinct
	err      error
	since    time.Time
	logged   time.Time
	failures int64 // since since
	unlogged int64 // since logged
}

// NewWatch returns a Watch that logs on log and calls count (nil: none)
// with the statement's name and BrokenClass for each failure it records.
func NewWatch(log *slog.Logger, count func(statement, class string)) *Watch {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Watch{log: log, count: count, interval: WatchLogInterval, now: time.Now,
		failed: map[string]*cause{}, logged: map[string]time.Time{}}
}

// Failed records err from the daemon's statement (a short, fixed name:
// "claim", "batch") and reports whether it is Broken. An error that is not
// broken is left to the caller: a transient failure is its to log.
func (w *Watch) Failed(statement string, err error) bool {
	class := BrokenClass(err)
	if class == "" {
		return false
	}
	if w.count != nil {
		w.count(statement, class)
	}
	key := causeKey(err, class)
	now := w.now()
	w.mu.Lock()
	c := w.failed[statement]
	if c == nil || c.key != key {
		c = &cause{key: key, since: now}
		w.failed[statement] = c
	}
	c.err = err
	c.failures++
	c.unlogged++
	// Once per interval for a statement and cause, even when it flaps
	// (a success in between, as when a grant is taken away under
	// statements already running).
	last, seen := w.logged[statement+"\x00"+key]
	logNow := !seen || now.Sub(last) >= w.interval
	var n int64
	if logNow {
		w.logged[statement+"\x00"+key] = now
		c.logged, n, c.unlogged = now, c.unlogged, 0
	}
	since := c.since
	w.mu.Unlock()
	if logNow {
		w.log.Error("statement refused by PostgreSQL as sent; it fails until an operator fixes the cause",
			"statement", statement, "class", class, "failures", n, "since", since.UTC().Format(time.RFC3339),
			"err", truncate(err.Error()))
	}
	return true
}

// OK records a success of statement: its cause, if any, is gone.
func (w *Watch) OK(statement string) {
	w.mu.Lock()
	c := w.failed[statement]
	delete(w.failed, statement)
	w.mu.Unlock()
	if c != nil && !c.logged.IsZero() {
		w.log.Info("statement succeeds again", "statement", statement, "failures", c.failures,
			"for", w.now().Sub(c.since).Round(time.Millisecond).String())
	}
}

// Err returns nil when no statement is failing as Broken, and otherwise an
// error wrapping ErrStatementBroken that names each failing statement, the
// time it began and its last error.
func (w *Watch) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.failed) == 0 {
		return nil
	}
	names := make([]string, 0, len(w.failed))
	for s := range w.failed {
		names = append(names, s)
	}
	sort.Strings(names)
	var b []byte
	for i, s := range names {
		c := w.failed[s]
		if i > 0 {
			b = append(b, "; "...)
		}
		b = fmt.Appendf(b, "%s failing since %s (%d failures): %s", s, c.since.UTC().Format(time.RFC3339), c.failures, truncate(c.err.Error()))
	}
	return fmt.Errorf("%w: %s", ErrStatementBroken, b)
}

// Healthy is Err with the signature the daemons' health checks have.
func (w *Watch) Healthy(context.Context) error { return w.Err() }

// causeKey tells causes apart: by SQLSTATE for PostgreSQL's, as one for
// pgx's (whose texts carry the arguments, different for every message).
func causeKey(err error, class string) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return class
}

func truncate(s string) string {
	if len(s) > maxCauseBytes {
		s = s[:maxCauseBytes] + "…"
	}
	return strings.ToValidUTF8(s, "?")
}
