package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/outbox/fleet"
)

// fleetDatabase is one database's line of `oncekit status --fleet`.
type fleetDatabase struct {
	Name string `json:"name"`
	// Up says that the database answered; Down says why not otherwise,
	// never with a credential.
	Up   bool   `json:"up"`
	Down string `json:"down,omitempty"`
	// Backlog and OldestSeconds are outbox.Unpublished's: the unpublished
	// rows, parked ones aside, and the age of the oldest unpublished
	// event.
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

// fleetReaders bounds the databases read at once: a list of hundreds
// sharing a few servers must not take their max_connections.
const fleetReaders = 16

// fleetStatus reads the databases of the list, fleetReaders at once, each
// within timeout (connecting included), and reports a database that
// cannot be read as down without waiting on the others.
func fleetStatus(ctx context.Context, dbs []fleet.Database, timeout time.Duration) []fleetDatabase {
	out := make([]fleetDatabase, len(dbs))
	slots := make(chan struct{}, fleetReaders)
	var wg sync.WaitGroup
	for i, d := range dbs {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			out[i] = readFleetDatabase(ctx, d)
			if !out[i].Up && out[i].Down == "" {
				out[i].Down = fmt.Sprintf("no answer within %v", timeout)
			}
		})
	}
	wg.Wait()
	return out
}

// readFleetDatabase reads d's outbox through the outbox package's reads in
// one read-only transaction.
func readFleetDatabase(ctx context.Context, d fleet.Database) fleetDatabase {
	r := fleetDatabase{Name: d.Name}
	cfg, err := pgx.ParseConfig(d.URL)
	if err != nil {
		r.Down = "the URL does not parse"
		return r
	}
	if deadline, ok := ctx.Deadline(); ok {
		cfg.ConnectTimeout = time.Until(deadline)
	}
	cfg.RuntimeParams["application_name"] = "oncekit-status"
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
// its secrets redacted, or "" for a timeout (fleetStatus says it).
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
		return "" // fleetStatus says the timeout
	}
	return "unreachable: " + oneLine(redact(lastCause(err)), 120)
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

// writeFleetStatus prints a line per database.
func writeFleetStatus(w io.Writer, dbs []fleetDatabase) error {
	lines := make([]string, 0, len(dbs))
	for _, d := range dbs {
		if !d.Up {
			lines = append(lines, strings.Join([]string{cell(d.Name), "DOWN", "-", "-", "-", "-", "-", d.Down}, "\t"))
			continue
		}
		oldest := "-"
		if d.Backlog > 0 || d.Logical {
			oldest = (time.Duration(d.OldestSeconds * float64(time.Second))).Round(time.Second).String()
		}
		lines = append(lines, fmt.Sprintf("%s\tup\t%d\t%s\t%d\t%d/%d\t%d", cell(d.Name), d.Backlog, oldest, d.Parked,
			d.Owned, d.Partitions, d.Relays))
	}
	return writeTable(w, "DATABASE\tSTATE\tBACKLOG\tOLDEST\tPARKED\tOWNED\tRELAYS", lines)
}
