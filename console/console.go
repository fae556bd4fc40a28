package console

import (
	"bytes"
	"context"
	"crypto/subtle"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/untrusted"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/sideeffect"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// csp allows the console's own stylesheet and script, and nothing else:
// no inline script or style, no other origin, no framing.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// pageLimit is the most rows a list shows per page.
const pageLimit = 50

// Console is the console's http.Handler.
type Console struct {
	db      oncekit.Pool
	cfg     Config
	log     *slog.Logger
	pages   map[string]*template.Template
	h       http.Handler
	ob      *outbox.Outbox
	store   *inbox.Store
	ledger  *sideeffect.Ledger
	edge    *idempotency.Edge
	records *idempotency.Records
	sql     statements
}

// New returns the console of the oncekit tables in db, usually a
// *pgxpool.Pool: the console serves requests concurrently, and its edge
// actions run through idempotency.New, which takes a Pool.
func New(db oncekit.Pool, cfg *Config) (*Console, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db is nil", ErrInvalidConfig)
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	con := &Console{db: db, cfg: c, log: c.Logger, sql: renderStatements(c.Schema)}
	var err error
	if con.ob, err = outbox.New(&outbox.Config{Schema: c.Schema, Slot: c.Slot}); err != nil {
		return nil, err
	}
	if con.store, err = inbox.NewStore(c.Schema); err != nil {
		return nil, err
	}
	if con.ledger, err = sideeffect.New(&sideeffect.Config{Schema: c.Schema}); err != nil {
		return nil, err
	}
	if con.edge, err = idempotency.New(db, &idempotency.Config{Schema: c.Schema, Logger: c.Logger}); err != nil {
		return nil, err
	}
	if con.records, err = idempotency.NewRecords(c.Schema); err != nil {
		return nil, err
	}
	if con.pages, err = parsePages(); err != nil {
		return nil, err
	}
	con.h = con.routes()
	return con, nil
}

// ServeHTTP implements http.Handler.
func (con *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) { con.h.ServeHTTP(w, r) }

func (con *Console) routes() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", con.overview)
	mux.HandleFunc("GET /chain", con.chain)
	mux.HandleFunc("GET /outbox", con.outboxPage)
	mux.HandleFunc("GET /inbox", con.inboxPage)
	mux.HandleFunc("GET /inbox/dead/{id}", con.deadLetterPage)
	mux.HandleFunc("GET /effects", con.effectsPage)
	mux.HandleFunc("GET /edge", con.edgePage)
	mux.HandleFunc("GET /edge/record", con.edgeRecordPage)
	mux.HandleFunc("GET /drift", con.driftPage)
	mux.HandleFunc("GET /audit", con.auditPage)
	if con.cfg.Fleet != nil {
		mux.HandleFunc("GET /fleet", con.fleetPage)
	}
	for path, act := range con.actions() {
		mux.Handle("POST "+path, con.action(act))
	}
	var h http.Handler = storableInput(mux)
	if con.cfg.Prefix != "" {
		h = http.StripPrefix(con.cfg.Prefix, h)
	}
	// Cross-site POSTs (a form on another site submitted by the
	// operator's browser) are refused before any handler runs.
	h = http.NewCrossOriginProtection().Handler(h)
	return securityHeaders(h)
}

// maxInput bounds each query or form value the console takes.
const maxInput = 4096

// storableInput answers 400 to a request with a query or form value that
// PostgreSQL could not take as text (invalid UTF-8, NUL) or longer than
// maxInput, before any page reads or acts on it.
func storableInput(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
		if err := r.ParseForm(); err != nil {
			http.Error(w, "the request's parameters could not be read", http.StatusBadRequest)
			return
		}
		for _, vs := range r.Form {
			for _, v := range vs {
				if len(v) > maxInput || !untrusted.Storable(v) {
					http.Error(w, "a parameter is not valid text (invalid UTF-8, NUL) or is longer than 4096 bytes", http.StatusBadRequest)
					return
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// securityHeaders sets the headers of every answer.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

// operator returns the authenticated operator of r, if any: the trusted
// header's name, or HTTP basic credentials matching Operators.
func (con *Console) operator(r *http.Request) (string, bool) {
	if con.cfg.TrustedHeader != "" {
		if name := strings.TrimSpace(r.Header.Get(con.cfg.TrustedHeader)); name != "" {
			return name, true
		}
	}
	name, pw, ok := r.BasicAuth()
	if !ok {
		return "", false
	}
	want, known := con.cfg.Operators[name]
	// Compared whatever the name, so that an unknown name takes as long.
	match := subtle.ConstantTimeCompare([]byte(pw), []byte(want)) == 1
	return name, known && match
}

// view is what every page's template gets.
type view struct {
	Title    string
	Base     string // the console's path prefix, for links
	Nav      string // the page's section
	Writes   bool
	Reveal   bool
	Fleet    bool // the fleet page is served
	Operator string
	Flash    string
	Error    string
	Data     any
}

func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"ago":       ago,
		"when":      when,
		"printable": printable,
		"short":     short,
		"bytes":     iecBytes,
		"secs":      optionalSeconds,
		"query":     url.QueryEscape,
		"path":      url.PathEscape,
	}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	pages := map[string]*template.Template{}
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if base == "layout" {
			continue
		}
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", n)
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", n, err)
		}
		pages[base] = t
	}
	return pages, nil
}

// render writes page with data, as a whole page, or only its main part
// for the overview's live refresh (X-Console-Fragment).
func (con *Console) render(w http.ResponseWriter, r *http.Request, page, title string, data any) {
	v := view{Title: title, Base: con.cfg.Prefix, Nav: page, Writes: con.cfg.Writes, Reveal: con.cfg.Reveal,
		Fleet: con.cfg.Fleet != nil, Flash: r.URL.Query().Get("done"), Data: data}
	v.Operator, _ = con.operator(r)
	name := "layout.html"
	if r.Header.Get("X-Console-Fragment") == "1" {
		name = "main"
	}
	var buf bytes.Buffer
	if err := con.pages[page].ExecuteTemplate(&buf, name, v); err != nil {
		con.log.Error("console: render", "page", page, "error", err)
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = buf.WriteTo(w)
}

// fail answers a page whose data could not be read.
func (con *Console) fail(w http.ResponseWriter, r *http.Request, page string, err error) {
	con.log.Error("console: read", "page", page, "error", err)
	status := http.StatusServiceUnavailable
	if errors.Is(err, errNotFound) {
		status = http.StatusNotFound
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	v := view{Title: "Error", Base: con.cfg.Prefix, Nav: page, Fleet: con.cfg.Fleet != nil, Error: "could not read: " + printable(err.Error())}
	_ = con.pages["error"].ExecuteTemplate(w, "layout.html", v)
}

var errNotFound = errors.New("not found")

// readOnly runs f in a read-only transaction, so that every figure of a
// page agrees, bounded by a statement timeout.
func (con *Console) readOnly(ctx context.Context, f func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, con.db, func(tx pgx.Tx) error {
		// Every query reads through an index: JIT compilation, which a
		// plan priced on a large table's estimates would get, only costs.
		if _, err := tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY; SET LOCAL statement_timeout = 5000; SET LOCAL jit = off"); err != nil {
			return err
		}
		return f(tx)
	})
}

// page reads the keyset cursor "after" of a list.
func after(r *http.Request) int64 {
	n, _ := strconv.ParseInt(r.URL.Query().Get("after"), 10, 64)
	return max(n, 0)
}

func ago(t any) string {
	var at time.Time
	switch v := t.(type) {
	case time.Time:
		at = v
	case *time.Time:
		if v == nil {
			return "—"
		}
		at = *v
	default:
		return ""
	}
	d := time.Since(at)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}

func when(t any) string {
	switch v := t.(type) {
	case time.Time:
		return v.UTC().Format(time.RFC3339)
	case *time.Time:
		if v != nil {
			return v.UTC().Format(time.RFC3339)
		}
	}
	return "—"
}

// short is s cut to 80 characters.
func short(s string) string {
	s = printable(s)
	if len(s) > 80 {
		return s[:77] + "…"
	}
	return s
}

// renderStatements renders the console's own SQL for schema.
func renderStatements(schema string) statements {
	r := func(sql string) string { return pgsql.Render(sql, schema) }
	return statements{audit: r(auditSQL), insertAudit: r(insertAuditSQL)}
}
