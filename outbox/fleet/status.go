package fleet

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit/internal/redact"
	"github.com/oncekit/oncekit/outbox"
)

// DatabaseStatus is one database's state as ReadStatus found it: what
// `oncekit status --fleet` prints a line of and the console's fleet page a
// row of.
type DatabaseStatus struct {
	Name string `json:"name"`
	// Up says that the database answered; Down says why not otherwise, in
	// one line of at most 120 characters that never holds a credential.
	Up   bool   `json:"up"`
	Down string `json:"down,omitempty"`
	// Backlog and OldestSeconds are outbox.Unpublished's: the unpublished
	// rows, parked ones aside, and the age of the oldest unpublished
	// event. Logical says the outbox runs in logical mode (its backlog is
	// the slot's).
	Backlog       int64   `json:"backlog"`
	OldestSeconds float64 `json:"oldest_unpublished_seconds"`
	Logical       bool    `json:"logical,omitempty"`
	Parked        int64   `json:"parked"`
	// Partitions and Owned count the partitions and those under a live
	// lease; Relays counts their distinct owners.
	Partitions int `json:"partitions"`
	Owned      int `json:"partitions_owned"`
	Relays     int `json:"relays"`
}

// Oldest is the age of the oldest unpublished event, to the second.
func (s DatabaseStatus) Oldest() time.Duration {
	return time.Duration(s.OldestSeconds * float64(time.Second)).Round(time.Second)
}

// statusReaders bounds the databases ReadStatus reads at once: a list of
// hundreds sharing a few servers must not take their max_connections.
const statusReaders = 16

// ReadStatus reads each database of dbs through the outbox's reads (its
// backlog, oldest unpublished event, parked rows and partition leases), at
// most 16 at once, each within timeout (connecting included) on a
// connection of its own named applicationName ("oncekit-status" if empty),
// and reports one that cannot be read as down without waiting on the
// others. The result is in the order of dbs.
func ReadStatus(ctx context.Context, dbs []Database, timeout time.Duration, applicationName string) []DatabaseStatus {
	if applicationName == "" {
		applicationName = "oncekit-status"
	}
	out := make([]DatabaseStatus, len(dbs))
	slots := make(chan struct{}, statusReaders)
	var wg sync.WaitGroup
	for i, d := range dbs {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			out[i] = readStatus(ctx, d, applicationName)
			if !out[i].Up && out[i].Down == "" {
				out[i].Down = fmt.Sprintf("no answer within %v", timeout)
			}
		})
	}
	wg.Wait()
	return out
}

// readStatus reads d's outbox in one read-only transaction.
func readStatus(ctx context.Context, d Database, applicationName string) DatabaseStatus {
	r := DatabaseStatus{Name: d.Name}
	cfg, err := pgx.ParseConfig(d.URL)
	if err != nil {
		r.Down = "the URL does not parse"
		return r
	}
	if deadline, ok := ctx.Deadline(); ok {
		cfg.ConnectTimeout = time.Until(deadline)
	}
	cfg.RuntimeParams["application_name"] = applicationName
	ob, err := outbox.New(&outbox.Config{Schema: d.Schema})
	if err != nil {
		r.Down = "bad schema"
		return r
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		r.Down = downReason(ctx, err)
		return r
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	err = pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		u, err := ob.Unpublished(ctx, tx)
		if err != nil {
			return err
		}
		r.Backlog, r.OldestSeconds, r.Logical = u.Rows.Pending, u.OldestAge().Seconds(), u.Logical
		if r.Parked, err = ob.ParkedCount(ctx, tx); err != nil {
			return err
		}
		leases, err := ob.PartitionLeases(ctx, tx)
		if err != nil {
			return err
		}
		owners := map[string]bool{}
		for _, l := range leases {
			if l.Owner != "" && l.LeaseLeft > 0 {
				r.Owned++
				owners[l.Owner] = true
			}
		}
		r.Partitions, r.Relays = len(leases), len(owners)
		return nil
	})
	if err != nil {
		r.Down = downReason(ctx, err)
		return r
	}
	r.Up = true
	return r
}

// downReason says why a database could not be read, in words that carry
// no credential: the server's error class, the connection's failure with
// its secrets redacted, or "" for a timeout (ReadStatus says it).
func downReason(ctx context.Context, err error) string {
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe):
		switch {
		case pe.Code == "28P01" || pe.Code == "28000":
			return "credentials refused (SQLSTATE " + pe.Code + ")"
		case pe.Code == "3D000":
			return "no such database (SQLSTATE 3D000)"
		case pe.Code == "42P01" || pe.Code == "3F000":
			return "no outbox tables in the schema: run oncekit migrate (SQLSTATE " + pe.Code + ")"
		case pe.Code == "42501":
			return "permission denied (SQLSTATE 42501)"
		}
		return "server error (SQLSTATE " + pe.Code + ")"
	case ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err):
		return "" // ReadStatus says the timeout
	}
	return "unreachable: " + oneLine(redact.String(lastCause(err)), 120)
}

// lastCause is the innermost message of err's chain: the network error
// without the connection's description.
func lastCause(err error) string {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err.Error()
		}
		err = next
	}
}

// oneLine folds whitespace (newlines included) and cuts s to at most n
// runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		s = string(r[:n-1]) + "…"
	}
	return s
}
