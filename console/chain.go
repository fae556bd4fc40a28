package console

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/sideeffect"
	"github.com/oncekit/oncekit/tracecontext"
)

// derivedID is an identifier the chain looks for, and how it came from the
// one given.
type derivedID struct {
	Value, How string
}

type chainEdge struct {
	State       string
	StatusCode  int
	CreatedAt   time.Time
	CompletedAt *time.Time
	ExpiresAt   time.Time
	Token       int64
	Recoveries  int
	Reason      string
	ResolvedBy  string
	StoredKey   string
	Stuck       bool
	// Tenant and Operation are the record's; Code and OperationID the
	// answer's problem code and the operation's ID kept on it.
	Tenant, Operation string
	Code              string
	OperationID       string
	// How says how the record was found.
	How string
}

// chainView is the chain page: one operation at every layer.
type chainView struct {
	Query, Tenant, Operation string
	Searched                 bool
	IDs                      []derivedID
	Edge                     *chainEdge
	Events                   []outbox.Event
	Claims                   []inbox.Claim
	Dead                     []inbox.DeadLetterSummary
	Effects                  []sideeffect.Row
	Found                    bool
}

// maxQuery bounds the identifier looked up.
const maxQuery = 512

// chain looks an identifier up at every layer: an Idempotency-Key (with
// its tenant and operation, which give the operation's ID), an operation,
// business or source ID, an event or message ID, an effect's idempotency
// key. Each ID the console can derive from it (Info.ID, and
// oncekit.DeriveID(id, name) for each of Config.Derive) is looked up too.
func (con *Console) chain(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	v := chainView{Query: strings.TrimSpace(q.Get("q")), Tenant: q.Get("tenant"), Operation: q.Get("operation")}
	if v.Query == "" || len(v.Query) > maxQuery {
		con.render(w, r, "chain", "Chain", v)
		return
	}
	v.Searched = true
	v.IDs = []derivedID{{v.Query, "as given"}}
	if v.Operation != "" { // a route with SharedScope has the tenant ""
		v.IDs = append(v.IDs, derivedID{oncekit.DeriveID(v.Tenant, v.Query).String(), "the operation's ID: Info.ID, DeriveID(tenant, key)"})
	}
	err := con.readOnly(r.Context(), func(tx pgx.Tx) error {
		if trace, ok := traceID(v.Query); ok {
			if err := con.readTrace(r, tx, trace, &v); err != nil {
				return err
			}
		}
		for _, id := range append([]derivedID(nil), v.IDs...) {
			for _, name := range con.cfg.Derive {
				v.IDs = append(v.IDs, derivedID{oncekit.DeriveID(id.Value, name).String(), "DeriveID(" + short(id.Value) + ", " + name + ")"})
			}
		}
		return con.readChain(r, tx, &v)
	})
	if err != nil {
		con.fail(w, r, "chain", err)
		return
	}
	v.Found = v.Edge != nil || len(v.Events)+len(v.Claims)+len(v.Dead)+len(v.Effects) > 0
	con.render(w, r, "chain", "Chain", v)
}

// traceID returns the W3C trace ID q names: 32 hex digits, or the second
// field of a traceparent. An all-zero ID is invalid and names nothing.
func traceID(q string) (string, bool) {
	if tracecontext.ValidTraceparent(q) {
		return q[3:35], true
	}
	q = strings.ToLower(q)
	if len(q) != 32 || strings.Trim(q, "0123456789abcdef") != "" || strings.Trim(q, "0") == "" {
		return "", false
	}
	return q, true
}

// readTrace adds to v's IDs what the trace ID leads to: the sources of the
// effects recorded in its trace, and the messages of its dead letters.
// Every layer is then looked up from those as from any ID given.
func (con *Console) readTrace(r *http.Request, tx pgx.Tx, trace string, v *chainView) error {
	sources, err := con.ledger.SourcesInTrace(r.Context(), tx, trace, traceLimit)
	if err != nil {
		return err
	}
	messages, err := con.store.MessagesInTrace(r.Context(), tx, trace, traceLimit)
	if err != nil {
		return err
	}
	add := func(ids []string, how string) {
		for _, id := range ids {
			if !slices.ContainsFunc(v.IDs, func(d derivedID) bool { return d.Value == id }) {
				v.IDs = append(v.IDs, derivedID{id, how + trace})
			}
		}
	}
	add(sources, "an effect's source ID, in trace ")
	add(messages, "a dead letter's message ID, in trace ")
	return nil
}

// traceLimit bounds the effects and the dead letters a trace ID leads to,
// chainLimit the rows of each layer the chain shows.
const traceLimit, chainLimit = 20, 100

// readEdge reads ref's record into v.Edge, found as how says; no record
// leaves v.Edge nil.
func (con *Console) readEdge(r *http.Request, tx pgx.Tx, ref idempotency.Ref, how string, v *chainView) error {
	rec, err := con.records.Get(r.Context(), tx, ref)
	if errors.Is(err, idempotency.ErrRecordNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	e := chainEdge{StoredKey: ref.StoredKey, Tenant: ref.Tenant, Operation: ref.Operation, How: how}
	e.State, e.StatusCode, e.CreatedAt, e.CompletedAt, e.ExpiresAt = string(rec.State), rec.StatusCode, rec.CreatedAt, rec.CompletedAt, rec.ExpiresAt
	e.Token, e.Recoveries, e.Reason, e.ResolvedBy = rec.Token, rec.Recoveries, rec.UnknownReason, rec.ResolvedBy
	e.Code = rec.ProblemCode
	if rec.OperationID != uuid.Nil {
		e.OperationID = rec.OperationID.String()
	}
	e.Stuck = rec.State == idempotency.StateUnknown || rec.State == idempotency.StateInProgress
	v.Edge = &e
	return nil
}

// readEdgeByOperationID finds the record whose operation's ID (a
// payment's ID: Info.ID) is the identifier given, when it is a UUID.
func (con *Console) readEdgeByOperationID(r *http.Request, tx pgx.Tx, v *chainView) error {
	id, err := uuid.Parse(v.Query)
	if err != nil {
		return nil
	}
	refs, err := con.records.ByOperationID(r.Context(), tx, id, 1)
	if err != nil || len(refs) == 0 {
		return err
	}
	return con.readEdge(r, tx, refs[0], "the operation's ID (Info.ID) kept on the record", v)
}

func (con *Console) readChain(r *http.Request, tx pgx.Tx, v *chainView) error {
	ctx := r.Context()
	if v.Operation != "" {
		ref := idempotency.Ref{Tenant: v.Tenant, Operation: v.Operation, StoredKey: idempotency.StoredKey(v.Query)}
		if err := con.readEdge(r, tx, ref, "its Idempotency-Key, tenant and operation", v); err != nil {
			return err
		}
	}
	if v.Edge == nil {
		if err := con.readEdgeByOperationID(r, tx, v); err != nil {
			return err
		}
	}
	var uuids []uuid.UUID
	var texts []string
	for _, id := range v.IDs {
		texts = append(texts, id.Value)
		if u, err := uuid.Parse(id.Value); err == nil {
			uuids = append(uuids, u)
		}
	}
	var err error
	if v.Events, err = con.ob.Events(ctx, tx, uuids, chainLimit); err != nil {
		return err
	}
	for _, e := range v.Events { // an event found by its ID is linked already; keep the list whole
		if !slices.Contains(uuids, e.ID) {
			uuids = append(uuids, e.ID)
			texts = append(texts, e.ID.String())
		}
	}
	if v.Claims, err = con.store.Claims(ctx, tx, uuids, chainLimit); err != nil {
		return err
	}
	if v.Dead, err = con.store.DeadLettersOf(ctx, tx, texts, chainLimit); err != nil {
		return err
	}
	v.Effects, err = con.ledger.Related(ctx, tx, texts, v.Query, chainLimit)
	return err
}
