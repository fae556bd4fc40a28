package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/idempotency"
)

const edgeUsage = `edge list [--operation OP] [--limit N] [--json]
       oncekit edge resolve completed|released --tenant T --operation OP (--key K | --stored-key D)
              --by NAME --reason TEXT [--status N --content-type T --location URL --body TEXT | --body-file F]`

// edgeSubcommands are list, which lists the edge's records waiting for an
// outcome (unknown, or in progress), and resolve, which settles one as an
// operator decided.
func edgeSubcommands(e *env, _ *flag.FlagSet, db *dbFlags) *subcommands {
	var (
		operation, tenant, key, storedKey, by, reason *string
		contentType, location, body, bodyFile         *string
		status, limit                                 *int
		ttl                                           *time.Duration
		asJSON                                        *bool
		to                                            idempotency.State // resolve's check sets it
	)
	// newEdge is the edge on the pool, for its operators' calls.
	newEdge := func(pool *pgxpool.Pool) (*idempotency.Edge, error) {
		return idempotency.New(pool, &idempotency.Config{Schema: db.schema()})
	}
	return &subcommands{
		flagsPerSubcommand: true,
		list: []subcommand{
			{name: "list", flags: func(fs *flag.FlagSet) {
				operation = fs.String("operation", "", "only records of this operation")
				limit = fs.Int("limit", 100, "at most this many records, the oldest first")
				asJSON = fs.Bool("json", false, "a JSON array")
			}, check: func(pos []string) error {
				if len(pos) > 0 {
					return usagef("unexpected argument %q", pos[0])
				}
				if *limit <= 0 {
					return usagef("--limit: %d must be positive", *limit)
				}
				return nil
			}, run: func(ctx context.Context, pool *pgxpool.Pool) error {
				edge, err := newEdge(pool)
				if err != nil {
					return err
				}
				rows, err := edge.Unsettled(ctx, pool, *operation, *limit)
				if err != nil {
					return err
				}
				return writeList(e.stdout, *asJSON, rows, unsettledJSON, "STATE\tOPERATION\tTENANT\tSTORED KEY\tSINCE\tREASON",
					func(r idempotency.UnsettledRecord) string {
						state := string(r.State)
						if r.Stale {
							state += " (lease expired)"
						}
						return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s", state, cell(r.Operation), cell(r.Tenant), r.StoredKey,
							timestamp(r.CreatedAt), oneLine(r.Reason, 60))
					})
			}},
			{name: "resolve", flags: func(fs *flag.FlagSet) {
				tenant = fs.String("tenant", "", "the record's scope (the route's Tenant)")
				operation = fs.String("operation", "", "the record's operation (required)")
				key = fs.String("key", "", "the Idempotency-Key as the client sent it")
				storedKey = fs.String("stored-key", "", "the key as stored (edge list's STORED KEY)")
				by = fs.String("by", "", "who decided (required; recorded on the record)")
				reason = fs.String("reason", "", "why (required; recorded on the record)")
				status = fs.Int("status", 0, "completed: the response's status code (required)")
				contentType = fs.String("content-type", "application/json", "completed: the response's Content-Type")
				location = fs.String("location", "", "completed: the response's Location, where the resource is")
				body = fs.String("body", "", "completed: the response's body")
				bodyFile = fs.String("body-file", "", "completed: read the response's body from this file")
				ttl = fs.Duration("ttl", 24*time.Hour, "completed: how long the response is replayed")
			}, check: func(pos []string) error {
				if len(pos) != 1 || (pos[0] != string(idempotency.StateCompleted) && pos[0] != string(idempotency.StateReleased)) {
					return usagef("usage: oncekit %s", edgeUsage)
				}
				to = idempotency.State(pos[0])
				switch {
				case *operation == "":
					return usagef("resolve needs --operation")
				case (*key == "") == (*storedKey == ""):
					return usagef("resolve needs --key or --stored-key, one of them")
				case *by == "" || *reason == "":
					return usagef("resolve needs --by and --reason: the decision is recorded")
				case to == idempotency.StateCompleted && (*status < 100 || *status > 599):
					return usagef("resolve completed needs --status, an HTTP status code")
				case *body != "" && *bodyFile != "":
					return usagef("give --body or --body-file, not both")
				}
				return nil
			}, run: func(ctx context.Context, pool *pgxpool.Pool) error {
				edge, err := newEdge(pool)
				if err != nil {
					return err
				}
				res := idempotency.Resolution{State: to, TTL: *ttl}
				if to == idempotency.StateCompleted {
					b := []byte(*body)
					if *bodyFile != "" {
						if b, err = os.ReadFile(*bodyFile); err != nil {
							return err
						}
					}
					h := http.Header{}
					if len(b) > 0 {
						h.Set("Content-Type", *contentType)
					}
					if *location != "" {
						h.Set("Location", *location)
					}
					res.Response = idempotency.StoredResponse{StatusCode: *status, Header: h, Body: b}
				}
				ref := idempotency.Ref{Tenant: *tenant, Operation: *operation, Key: *key, StoredKey: *storedKey}
				if err := edge.Resolve(ctx, pool, ref, res, idempotency.Decision{By: *by, Note: *reason}); err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "record of %s resolved as %s by %s\n", cell(*operation), to, cell(*by))
				return nil
			}},
		},
	}
}

// unsettledRecordJSON is a record in `edge list --json`.
type unsettledRecordJSON struct {
	Tenant    string    `json:"tenant"`
	Operation string    `json:"operation"`
	StoredKey string    `json:"stored_key"`
	State     string    `json:"state"`
	Stale     bool      `json:"lease_expired"`
	Reason    string    `json:"reason,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

func unsettledJSON(rows []idempotency.UnsettledRecord) []unsettledRecordJSON {
	out := make([]unsettledRecordJSON, 0, len(rows))
	for _, r := range rows {
		out = append(out, unsettledRecordJSON{Tenant: r.Tenant, Operation: r.Operation, StoredKey: r.StoredKey,
			State: string(r.State), Stale: r.Stale, Reason: r.Reason, CreatedAt: r.CreatedAt})
	}
	return out
}
