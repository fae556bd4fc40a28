package console

import (
	"cmp"
	"errors"
	"math"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/drift"
	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/report"
)

func (con *Console) overview(w http.ResponseWriter, r *http.Request) {
	var rep report.Status
	err := con.readOnly(r.Context(), func(tx pgx.Tx) error {
		var err error
		rep, err = report.Read(r.Context(), tx, con.cfg.Schema, con.cfg.Slot, con.cfg.Overdue, con.cfg.Recent)
		return err
	})
	if err != nil {
		con.fail(w, r, "overview", err)
		return
	}
	con.render(w, r, "overview", "Overview", rep)
}

// outboxView is the outbox page.
type outboxView struct {
	Status report.Outbox
	Parked []outbox.Entry
}

func (con *Console) outboxPage(w http.ResponseWriter, r *http.Request) {
	var v outboxView
	err := con.readOnly(r.Context(), func(tx pgx.Tx) error {
		rep, err := report.Read(r.Context(), tx, con.cfg.Schema, con.cfg.Slot, con.cfg.Overdue, con.cfg.Recent)
		if err != nil {
			return err
		}
		v.Status = rep.Outbox
		v.Parked, err = con.ob.List(r.Context(), tx, outbox.ListOptions{State: outbox.StateParked, Limit: pageLimit})
		return err
	})
	if err != nil {
		con.fail(w, r, "outbox", err)
		return
	}
	con.render(w, r, "outbox", "Outbox", v)
}

// inboxView is the inbox page.
type inboxView struct {
	Consumers []report.Consumer
	Groups    []inbox.DeadLetterGroup
	CanReplay bool
}

func (con *Console) inboxPage(w http.ResponseWriter, r *http.Request) {
	v := inboxView{CanReplay: con.cfg.Publisher != nil}
	err := con.readOnly(r.Context(), func(tx pgx.Tx) error {
		rep, err := report.Read(r.Context(), tx, con.cfg.Schema, con.cfg.Slot, con.cfg.Overdue, con.cfg.Recent)
		if err != nil {
			return err
		}
		v.Consumers = rep.Consumers
		v.Groups, err = con.store.DeadLetterGroups(r.Context(), tx, pageLimit)
		return err
	})
	if err != nil {
		con.fail(w, r, "inbox", err)
		return
	}
	con.render(w, r, "inbox", "Inbox", v)
}

// deadView is one dead letter's page.
type deadView struct {
	inbox.DeadLetter
	Headers   []header
	Payload   string // shown only when revealed
	Revealed  bool
	CanReplay bool
}

type header struct{ Name, Value string }

func (con *Console) deadLetterPage(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		con.fail(w, r, "inbox", errNotFound)
		return
	}
	dl, err := con.store.GetDeadLetter(r.Context(), con.db, id)
	if errors.Is(err, inbox.ErrDeadLetterNotFound) {
		err = errNotFound
	}
	if err != nil {
		con.fail(w, r, "inbox", err)
		return
	}
	v := deadView{DeadLetter: dl, CanReplay: con.cfg.Publisher != nil && dl.ReplayedAt == nil}
	for name, values := range dl.Headers {
		for _, val := range values {
			v.Headers = append(v.Headers, header{printable(name), printable(val)})
		}
	}
	sort.Slice(v.Headers, func(i, j int) bool { return v.Headers[i].Name < v.Headers[j].Name })
	if con.cfg.Reveal && r.URL.Query().Get("reveal") == "1" {
		v.Revealed, v.Payload = true, printable(string(dl.Payload))
	}
	con.render(w, r, "dead", "Dead letter "+strconv.FormatInt(id, 10), v)
}

// overdueEffect is a pending effect past due.
type overdueEffect struct {
	ID             int64
	Kind, SourceID string
	Attempts       int
	Due            time.Time
	LastError      string
}

// unknownEffect is an effect waiting for an operator.
type unknownEffect struct {
	ID             int64
	Kind, SourceID string
	Attempts       int
	LastError, Key string
}

// effectsView is the side effects page: unknown and overdue first.
type effectsView struct {
	Counts  []report.Effects
	Capped  bool // the live counts stopped at report.LiveCap
	Unknown []unknownEffect
	Overdue []overdueEffect
	After   int64 // the next page of unknown effects starts after this ID
}

func (con *Console) effectsPage(w http.ResponseWriter, r *http.Request) {
	var v effectsView
	err := con.readOnly(r.Context(), func(tx pgx.Tx) error {
		rep, err := report.Read(r.Context(), tx, con.cfg.Schema, con.cfg.Slot, con.cfg.Overdue, con.cfg.Recent)
		if err != nil {
			return err
		}
		v.Counts, v.Capped = rep.Effects, rep.EffectsCapped
		unknown, err := con.ledger.UnknownAfter(r.Context(), tx, after(r), pageLimit)
		if err != nil {
			return err
		}
		for _, e := range unknown {
			v.Unknown = append(v.Unknown, unknownEffect{ID: e.ID, Kind: e.Kind, SourceID: e.SourceID, Attempts: e.Attempts,
				LastError: e.LastError, Key: e.Key})
		}
		if len(v.Unknown) == pageLimit {
			v.After = v.Unknown[len(v.Unknown)-1].ID
		}
		overdue, err := con.ledger.MostOverdue(r.Context(), tx, con.cfg.Overdue, pageLimit)
		for _, e := range overdue {
			o := overdueEffect{ID: e.ID, Kind: e.Kind, SourceID: e.SourceID, Attempts: e.Attempts, LastError: e.LastError}
			if e.NextAttemptAt != nil {
				o.Due = *e.NextAttemptAt
			}
			v.Overdue = append(v.Overdue, o)
		}
		return err
	})
	if err != nil {
		con.fail(w, r, "effects", err)
		return
	}
	con.render(w, r, "effects", "Side effects", v)
}

func (con *Console) edgePage(w http.ResponseWriter, r *http.Request) {
	var list []idempotency.UnsettledRecord
	err := con.readOnly(r.Context(), func(tx pgx.Tx) error {
		var err error
		list, err = con.edge.Unsettled(r.Context(), tx, r.URL.Query().Get("operation"), pageLimit)
		return err
	})
	if err != nil {
		con.fail(w, r, "edge", err)
		return
	}
	con.render(w, r, "edge", "Edge", list)
}

// edgeRecordView is one edge record's page.
type edgeRecordView struct {
	Tenant, Operation, StoredKey string
	State                        string
	StatusCode                   int
	Headers                      string
	Body                         string // shown only when revealed
	HasBody, Sealed, Revealed    bool
	CreatedAt                    time.Time
	CompletedAt                  *time.Time
	ExpiresAt                    time.Time
	Reason, ResolvedBy, Note     string
}

func (con *Console) edgeRecordPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	v := edgeRecordView{Tenant: q.Get("tenant"), Operation: q.Get("operation"), StoredKey: q.Get("stored_key")}
	rec, err := idempotency.Record{}, errNotFound
	if v.Operation != "" && v.StoredKey != "" {
		rec, err = con.records.Get(r.Context(), con.db, idempotency.Ref{Tenant: v.Tenant, Operation: v.Operation, StoredKey: v.StoredKey})
	}
	if errors.Is(err, idempotency.ErrRecordNotFound) {
		err = errNotFound
	}
	if err != nil {
		con.fail(w, r, "edge", err)
		return
	}
	body := rec.Body
	v.State, v.StatusCode, v.Headers, v.Sealed = string(rec.State), rec.StatusCode, rec.Headers, rec.Sealed
	v.CreatedAt, v.CompletedAt, v.ExpiresAt = rec.CreatedAt, rec.CompletedAt, rec.ExpiresAt
	v.Reason, v.ResolvedBy, v.Note = rec.UnknownReason, rec.ResolvedBy, rec.ResolutionNote
	v.HasBody = body != nil
	if v.HasBody && !v.Sealed && con.cfg.Reveal && q.Get("reveal") == "1" {
		v.Revealed, v.Body = true, printable(string(body))
	}
	v.Headers = printable(v.Headers)
	con.render(w, r, "edgerecord", "Edge record", v)
}

// driftView is the drift page.
type driftView struct {
	Ran      bool
	Report   drift.Report
	Problems []drift.Finding
}

func (con *Console) driftPage(w http.ResponseWriter, r *http.Request) {
	var v driftView
	if r.URL.Query().Get("run") == "1" {
		cfg := drift.Config{}
		if con.cfg.Drift != nil {
			cfg = *con.cfg.Drift
		}
		cfg.Schema, cfg.Registerer, cfg.Logger = con.cfg.Schema, nil, con.log
		cfg.Slot = cmp.Or(cfg.Slot, con.cfg.Slot)
		checker, err := drift.New(con.db, &cfg)
		if err == nil {
			v.Report, err = checker.Run(r.Context())
		}
		if err != nil {
			con.fail(w, r, "drift", err)
			return
		}
		v.Ran = true
	}
	con.render(w, r, "drift", "Drift", v)
}

// auditEntry is one row of console_audit.
type auditEntry struct {
	ID                       int64
	At                       time.Time
	Operator, Action, Target string
	Count                    int
	Note                     string
}

// auditView is the audit page.
type auditView struct {
	Entries []auditEntry
	Before  int64
}

func (con *Console) auditPage(w http.ResponseWriter, r *http.Request) {
	before, err := strconv.ParseInt(r.URL.Query().Get("before"), 10, 64)
	if err != nil || before <= 0 {
		before = math.MaxInt64 // the first page
	}
	rows, err := con.db.Query(r.Context(), con.sql.audit, before, pageLimit)
	var v auditView
	if err == nil {
		v.Entries, err = pgx.CollectRows(rows, pgx.RowToStructByPos[auditEntry])
	}
	if err != nil {
		con.fail(w, r, "audit", err)
		return
	}
	if len(v.Entries) == pageLimit {
		v.Before = v.Entries[len(v.Entries)-1].ID
	}
	con.render(w, r, "audit", "Audit", v)
}
