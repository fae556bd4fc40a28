package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/sideeffect"
)

// maxReplay bounds the dead letters one replay of a group republishes.
const maxReplay = 1000

// action is one thing an operator can do. plan reads the form and says
// what the action will do (the dry run shown for confirmation); run does
// it, as operator, in tx (the audit entry is written in the same
// transaction) and returns what it did and to how many.
type action struct {
	name string
	plan func(r *http.Request) (plan, error)
	run  func(ctx context.Context, tx pgx.Tx, p plan, operator string) (int, error)
	// apart runs outside the audit's transaction (a replay publishes and
	// commits dead letter by dead letter).
	apart bool
	back  string // the page to return to
}

// plan is what an action will do, as the confirmation shows it.
type plan struct {
	Action  string
	Target  string   // what it acts on, for the audit
	Summary string   // one line
	Items   []string // what exactly, when several
	Note    string   // the operator's reason
	Fields  url.Values
	values  any // the parsed form, for run
}

var errBadForm = errors.New("the form is incomplete or malformed")

func (con *Console) actions() map[string]action {
	return map[string]action{
		"/outbox/unpark": {name: "outbox.unpark", back: "/outbox", plan: func(r *http.Request) (plan, error) {
			id, err := uuid.Parse(r.PostFormValue("id"))
			if err != nil {
				return plan{}, errBadForm
			}
			return plan{Target: "message " + id.String(), Summary: "unpark message " + id.String() +
				": the relay publishes it (and its key's later messages) again", values: id}, nil
		}, run: func(ctx context.Context, tx pgx.Tx, p plan, _ string) (int, error) {
			n, err := con.ob.Unpark(ctx, tx, p.values.(uuid.UUID))
			return int(n), err
		}},
		"/inbox/replay": {name: "inbox.replay", back: "/inbox", apart: true, plan: con.planReplay,
			run: func(ctx context.Context, _ pgx.Tx, p plan, _ string) (int, error) {
				done := 0
				for _, id := range p.values.([]int64) {
					if _, err := con.store.Replay(ctx, con.db, con.cfg.Publisher, id, inbox.ReplayOptions{AssignID: true}); err != nil {
						return done, fmt.Errorf("replayed %d, then dead letter %d: %w", done, id, err)
					}
					done++
				}
				return done, nil
			}},
		"/effects/resolve": {name: "effects.resolve", back: "/effects", plan: func(r *http.Request) (plan, error) {
			id, err := strconv.ParseInt(r.PostFormValue("id"), 10, 64)
			to := sideeffect.State(r.PostFormValue("to"))
			if err != nil || (to != sideeffect.StateConfirmed && to != sideeffect.StateFailed) {
				return plan{}, errBadForm
			}
			return plan{Target: fmt.Sprintf("effect %d", id), Summary: fmt.Sprintf("resolve effect %d as %s: nothing is sent", id, to),
				values: [2]any{id, to}}, nil
		}, run: func(ctx context.Context, tx pgx.Tx, p plan, operator string) (int, error) {
			v := p.values.([2]any)
			return 1, con.ledger.Resolve(ctx, tx, v[0].(int64), v[1].(sideeffect.State), sideeffect.Decision{By: operator, Note: p.Note})
		}},
		"/effects/retry": {name: "effects.retry", back: "/effects", plan: func(r *http.Request) (plan, error) {
			id, err := strconv.ParseInt(r.PostFormValue("id"), 10, 64)
			if err != nil {
				return plan{}, errBadForm
			}
			return plan{Target: fmt.Sprintf("effect %d", id), Summary: fmt.Sprintf("retry effect %d with the same idempotency key", id),
				values: id}, nil
		}, run: func(ctx context.Context, tx pgx.Tx, p plan, operator string) (int, error) {
			return 1, con.ledger.Retry(ctx, tx, p.values.(int64), sideeffect.Decision{By: operator, Note: p.Note})
		}},
		"/edge/resolve": {name: "edge.resolve", back: "/edge", plan: planEdgeResolve,
			run: func(ctx context.Context, tx pgx.Tx, p plan, operator string) (int, error) {
				v := p.values.(edgeResolution)
				return 1, con.edge.Resolve(ctx, tx, v.ref, v.res, idempotency.Decision{By: operator, Note: p.Note})
			}},
	}
}

// planReplay plans the replay of one dead letter (id) or of a group
// (consumer and group, among the latest waiting ones).
func (con *Console) planReplay(r *http.Request) (plan, error) {
	if con.cfg.Publisher == nil {
		return plan{}, errors.New("replay needs Config.Publisher")
	}
	if id, err := strconv.ParseInt(r.PostFormValue("id"), 10, 64); err == nil {
		return plan{Target: fmt.Sprintf("dead letter %d", id), Summary: fmt.Sprintf("replay dead letter %d with its message's ID", id),
			values: []int64{id}}, nil
	}
	consumer, group := r.PostFormValue("consumer"), r.PostFormValue("group")
	if consumer == "" || group == "" {
		return plan{}, errBadForm
	}
	found, err := con.store.DeadLettersInGroup(r.Context(), con.db, consumer, group, maxReplay)
	if err != nil {
		return plan{}, err
	}
	if len(found) == 0 {
		return plan{}, errors.New("no dead letter waits in this group")
	}
	p := plan{Target: "group " + group + " of " + consumer,
		Summary: fmt.Sprintf("replay %d dead letters of %s (group %s), each with its message's ID", len(found), printable(consumer), group)}
	ids := make([]int64, 0, len(found))
	for _, d := range found {
		ids = append(ids, d.ID)
		p.Items = append(p.Items, fmt.Sprintf("dead letter %d, message %s", d.ID, short(d.MessageID)))
	}
	p.values = ids
	return p, nil
}

type edgeResolution struct {
	ref idempotency.Ref
	res idempotency.Resolution
}

func planEdgeResolve(r *http.Request) (plan, error) {
	ref := idempotency.Ref{Tenant: r.PostFormValue("tenant"), Operation: r.PostFormValue("operation"), StoredKey: r.PostFormValue("stored_key")}
	res := idempotency.Resolution{State: idempotency.State(r.PostFormValue("to"))}
	if ref.Operation == "" || ref.StoredKey == "" {
		return plan{}, errBadForm
	}
	switch res.State {
	case idempotency.StateReleased:
	case idempotency.StateCompleted:
		status, err := strconv.Atoi(r.PostFormValue("status"))
		if err != nil || status < 100 || status > 599 {
			return plan{}, errBadForm
		}
		h := http.Header{}
		if loc := r.PostFormValue("location"); loc != "" {
			h.Set("Location", loc)
		}
		body := r.PostFormValue("body")
		if body != "" {
			h.Set("Content-Type", "application/json")
		}
		res.Response = idempotency.StoredResponse{StatusCode: status, Header: h, Body: []byte(body)}
	default:
		return plan{}, errBadForm
	}
	target := "record " + short(ref.StoredKey) + " of " + printable(ref.Operation)
	return plan{Target: target, Summary: "resolve " + target + " (tenant " + printable(ref.Tenant) + ") as " + string(res.State),
		values: edgeResolution{ref, res}}, nil
}

// action serves one action: writes on, an authenticated operator, a plan,
// then, once confirmed, the action and its audit entry.
func (con *Console) action(a action) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !con.cfg.Writes {
			con.refuse(w, r, http.StatusForbidden, "this console is read-only: start it with writes enabled to act")
			return
		}
		operator, ok := con.operator(r)
		if !ok {
			if len(con.cfg.Operators) > 0 {
				w.Header().Set("WWW-Authenticate", `Basic realm="oncekit console", charset="UTF-8"`)
			}
			con.refuse(w, r, http.StatusUnauthorized, "acting needs an authenticated operator")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
		p, err := a.plan(r)
		if err != nil {
			con.refuse(w, r, http.StatusBadRequest, err.Error())
			return
		}
		p.Action, p.Note = a.name, strings.TrimSpace(r.PostFormValue("note"))
		p.Fields = url.Values{}
		for k, vs := range r.PostForm {
			if k != "confirm" && k != "note" {
				p.Fields[k] = vs
			}
		}
		if r.PostFormValue("confirm") != "yes" {
			con.render(w, r, "confirm", "Confirm", p)
			return
		}
		if p.Note == "" {
			p.Note = "by the console"
		}
		n, err := con.perform(r.Context(), a, p, operator)
		con.log.Info("console: action", "operator", operator, "action", a.name, "target", p.Target, "count", n, "error", err)
		if err != nil {
			con.refuse(w, r, http.StatusConflict, printable(err.Error()))
			return
		}
		done := fmt.Sprintf("%s: %s (%d) by %s", a.name, p.Target, n, operator)
		http.Redirect(w, r, con.cfg.Prefix+a.back+"?done="+url.QueryEscape(done), http.StatusSeeOther)
	})
}

// perform runs the action and writes its audit entry: in one transaction,
// or, for an action apart, the entry after it (with what it did, even when
// it stopped on an error).
func (con *Console) perform(ctx context.Context, a action, p plan, operator string) (int, error) {
	if a.apart {
		n, err := a.run(ctx, nil, p, operator)
		note := p.Note
		if err != nil {
			note += " (stopped: " + err.Error() + ")"
		}
		if _, aerr := con.db.Exec(context.WithoutCancel(ctx), con.sql.insertAudit, operator, a.name, p.Target, n, note); aerr != nil {
			return n, errors.Join(err, fmt.Errorf("audit: %w", aerr))
		}
		return n, err
	}
	var n int
	err := pgx.BeginFunc(ctx, con.db, func(tx pgx.Tx) error {
		var err error
		if n, err = a.run(ctx, tx, p, operator); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, con.sql.insertAudit, operator, a.name, p.Target, n, p.Note)
		return err
	})
	return n, err
}

// refuse answers an action that is not done.
func (con *Console) refuse(w http.ResponseWriter, r *http.Request, status int, why string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	v := view{Title: "Not done", Base: con.cfg.Prefix, Error: why}
	_ = con.pages["error"].ExecuteTemplate(w, "layout.html", v)
}
