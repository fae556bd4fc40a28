package console_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/console"
	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/testkit/consoletest"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/report"
)

const (
	operator = "ana"
	password = "correct horse battery"
)

// server serves a console of a seeded schema.
func server(t *testing.T, cfg console.Config) (*httptest.Server, *testenv.DB, consoletest.Seeded) {
	t.Helper()
	db := testenv.NewDB(t)
	seeded := consoletest.Seed(t, db)
	cfg.Schema = db.Schema
	con, err := console.New(db.Pool, &cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(con)
	t.Cleanup(srv.Close)
	return srv, db, seeded
}

type page struct {
	status int
	header http.Header
	body   string
}

func get(t *testing.T, u string) page {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return page{resp.StatusCode, resp.Header, string(b)}
}

// post submits a form as a browser of the console's own origin would.
func post(t *testing.T, srv *httptest.Server, path string, form url.Values, auth bool, header map[string]string) page {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	if auth {
		req.SetBasicAuth(operator, password)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return page{resp.StatusCode, resp.Header, string(b)}
}

var inlineScript = regexp.MustCompile(`<script(?:\s[^>]*)?>\s*[^<\s]|\sstyle=|\son[a-z]+=`)

// Every page answers under a strict Content-Security-Policy, with no
// inline script, style or event handler for it to have to allow.
func TestEveryPageIsServedUnderAStrictPolicy(t *testing.T) {
	t.Parallel()
	srv, _, s := server(t, console.Config{Writes: true, Operators: map[string]string{operator: password}})
	for _, path := range []string{"/", "/chain", "/chain?q=" + consoletest.Key + "&tenant=acme&operation=create-payment",
		"/outbox", "/inbox", "/inbox/dead/" + strconv.FormatInt(s.DeadLetterID, 10), "/effects", "/edge",
		"/edge/record?tenant=acme&operation=create-payment&stored_key=" + idempotency.StoredKey(consoletest.Key),
		"/drift", "/drift?run=1", "/audit", "/static/console.css", "/static/console.js"} {
		p := get(t, srv.URL+path)
		require.Equal(t, http.StatusOK, p.status, path+"\n"+p.body)
		csp := p.header.Get("Content-Security-Policy")
		require.Contains(t, csp, "default-src 'none'", path)
		require.Contains(t, csp, "script-src 'self'", path)
		require.NotContains(t, csp, "unsafe-inline", path)
		require.Equal(t, "nosniff", p.header.Get("X-Content-Type-Options"))
		if strings.HasPrefix(p.header.Get("Content-Type"), "text/html") {
			require.NotRegexp(t, inlineScript, p.body, path)
			require.NotContains(t, p.body, password, "never a credential")
		}
	}
}

// The chain finds the payment at every layer from its Idempotency-Key,
// its tenant and its operation.
func TestChainFollowsAPaymentThroughEveryLayer(t *testing.T) {
	t.Parallel()
	srv, _, s := server(t, console.Config{Derive: []string{consoletest.EventName}})
	p := get(t, srv.URL+"/chain?"+url.Values{"q": {consoletest.Key}, "tenant": {consoletest.Tenant}, "operation": {consoletest.Operation}}.Encode())
	require.Equal(t, http.StatusOK, p.status)
	require.Contains(t, p.body, s.PaymentID.String(), "the operation's ID")
	require.Regexp(t, `id="chain-edge"[\s\S]*completed[\s\S]*201`, p.body)
	require.Regexp(t, `id="chain-events"[\s\S]*`+s.EventID.String()+`[\s\S]*published`, p.body)
	require.Regexp(t, `id="chain-claims"[\s\S]*`+s.EventID.String()+`[\s\S]*ledger`, p.body)
	require.Regexp(t, `id="chain-dead"[\s\S]*mailer[\s\S]*waiting`, p.body)
	require.Regexp(t, `id="chain-effects"[\s\S]*provider.capture[\s\S]*unknown`, p.body)
	require.NotContains(t, p.body, consoletest.Secret)

	// From the payment's ID alone: its key's record, by the operation's ID
	// the record keeps, and every layer below the edge.
	p = get(t, srv.URL+"/chain?q="+s.PaymentID.String())
	require.Regexp(t, `id="chain-edge"[\s\S]*completed[\s\S]*Info.ID[\s\S]*201`, p.body)
	require.Regexp(t, `id="chain-edge-operation-id"><code>`+s.PaymentID.String(), p.body)
	require.Contains(t, p.body, "stored_key="+idempotency.StoredKey(consoletest.Key))
	require.Regexp(t, `id="chain-events"[\s\S]*`+s.EventID.String(), p.body)
	require.NotContains(t, p.body, consoletest.Secret)

	// From the event's ID alone: every layer below the edge.
	p = get(t, srv.URL+"/chain?q="+s.EventID.String())
	require.Contains(t, p.body, "ledger")
	require.Contains(t, p.body, "mailer")
	require.Contains(t, get(t, srv.URL+"/chain?q=nothing-like-it").body, `id="nothing"`)
}

// The chain finds the payment from the W3C trace ID its effect was
// recorded in and its dead letter's message carried, given alone or as a
// traceparent, in either case: the effect and the dead letter by the trace,
// the event and its claims from the dead letter's message ID, and the
// payment's other layers from the effect's source ID.
func TestChainFromATraceID(t *testing.T) {
	t.Parallel()
	srv, _, s := server(t, console.Config{Derive: []string{consoletest.EventName}})
	for _, q := range []string{consoletest.TraceID, strings.ToUpper(consoletest.TraceID), "00-" + consoletest.TraceID + "-00f067aa0ba902b7-01"} {
		p := get(t, srv.URL+"/chain?q="+url.QueryEscape(q))
		require.Equal(t, http.StatusOK, p.status)
		require.Contains(t, p.body, "in trace "+consoletest.TraceID, q)
		require.Regexp(t, `id="chain-events"[\s\S]*`+s.EventID.String()+`[\s\S]*published`, p.body, q)
		require.Regexp(t, `id="chain-claims"[\s\S]*`+s.EventID.String()+`[\s\S]*ledger`, p.body, q)
		require.Regexp(t, `id="chain-dead"[\s\S]*mailer[\s\S]*waiting`, p.body, q)
		require.Regexp(t, `id="chain-effects"[\s\S]*provider.capture[\s\S]*unknown`, p.body, q)
	}
	for _, q := range []string{"4bf92f3577b34da6a3ce929d0e0e4737", strings.Repeat("0", 32)} {
		require.Contains(t, get(t, srv.URL+"/chain?q="+q).body, `id="nothing"`, q)
	}
}

// Writes are refused on a read-only console, without credentials (or with
// wrong ones), and cross-origin; with all three right an action asks for
// confirmation first, then acts and is audited.
func TestActionsAreSafeByDefault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	form := func(s consoletest.Seeded) url.Values {
		return url.Values{"id": {strconv.FormatInt(s.EffectID, 10)}, "to": {"confirmed"}, "note": {"the provider's dashboard shows it"}}
	}

	ro, _, s := server(t, console.Config{})
	require.Equal(t, http.StatusForbidden, post(t, ro, "/effects/resolve", form(s), true, nil).status, "read-only")

	srv, db, s := server(t, console.Config{Writes: true, Operators: map[string]string{operator: password}})
	p := post(t, srv, "/effects/resolve", form(s), false, nil)
	require.Equal(t, http.StatusUnauthorized, p.status, "no credentials")
	require.Contains(t, p.header.Get("WWW-Authenticate"), "Basic")
	wrong := post(t, srv, "/effects/resolve", form(s), false, map[string]string{"Authorization": "Basic " + basic(operator, "wrong password!")})
	require.Equal(t, http.StatusUnauthorized, wrong.status, "wrong password")
	cross := post(t, srv, "/effects/resolve", form(s), true, map[string]string{"Sec-Fetch-Site": "cross-site"})
	require.Equal(t, http.StatusForbidden, cross.status, "cross-origin")
	crossOrigin := post(t, srv, "/effects/resolve", form(s), true, map[string]string{"Sec-Fetch-Site": "", "Origin": "https://evil.example"})
	require.Equal(t, http.StatusForbidden, crossOrigin.status, "cross-origin by Origin")
	var state string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT state FROM side_effects WHERE id = $1`, s.EffectID).Scan(&state))
	require.Equal(t, "unknown", state, "nothing refused was done")

	confirm := post(t, srv, "/effects/resolve", form(s), true, nil)
	require.Equal(t, http.StatusOK, confirm.status)
	require.Contains(t, confirm.body, `id="confirm"`)
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT state FROM side_effects WHERE id = $1`, s.EffectID).Scan(&state))
	require.Equal(t, "unknown", state, "not before confirmation")

	f := form(s)
	f.Set("confirm", "yes")
	done := post(t, srv, "/effects/resolve", f, true, nil)
	require.Equal(t, http.StatusSeeOther, done.status, done.body)
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT state FROM side_effects WHERE id = $1`, s.EffectID).Scan(&state))
	require.Equal(t, "confirmed", state)
	var by, action, note string
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT operator, action, count, note FROM console_audit`).Scan(&by, &action, &n, &note))
	require.Equal(t, []any{operator, "effects.resolve", 1, "the provider's dashboard shows it"}, []any{by, action, n, note})
	require.Contains(t, get(t, srv.URL+"/audit").body, "effects.resolve")
}

// A proxy's trusted header names the operator; without it, nobody acts.
func TestTrustedHeaderNamesTheOperator(t *testing.T) {
	t.Parallel()
	srv, db, s := server(t, console.Config{Writes: true, TrustedHeader: "X-Forwarded-User"})
	f := url.Values{"id": {s.ParkedID.String()}, "confirm": {"yes"}}
	require.Equal(t, http.StatusUnauthorized, post(t, srv, "/outbox/unpark", f, false, nil).status)
	require.Equal(t, http.StatusSeeOther, post(t, srv, "/outbox/unpark", f, false, map[string]string{"X-Forwarded-User": "bo"}).status)
	var by string
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT operator FROM console_audit WHERE action = 'outbox.unpark'`).Scan(&by))
	require.Equal(t, "bo", by)
}

// Payloads and stored responses are hidden by default, even asked for;
// a console that allows revealing shows them on request.
func TestPayloadsAreRedactedByDefault(t *testing.T) {
	t.Parallel()
	record := "/edge/record?tenant=acme&operation=create-payment&stored_key=" + idempotency.StoredKey(consoletest.Key)
	srv, _, s := server(t, console.Config{})
	dead := "/inbox/dead/" + strconv.FormatInt(s.DeadLetterID, 10)
	for _, path := range []string{dead, dead + "?reveal=1", record, record + "&reveal=1"} {
		p := get(t, srv.URL+path)
		require.Equal(t, http.StatusOK, p.status)
		require.NotContains(t, p.body, consoletest.Secret, path)
	}
	open, _, s := server(t, console.Config{Reveal: true})
	dead = "/inbox/dead/" + strconv.FormatInt(s.DeadLetterID, 10)
	require.NotContains(t, get(t, open.URL+dead).body, consoletest.Secret, "hidden until asked")
	require.Contains(t, get(t, open.URL+dead+"?reveal=1").body, consoletest.Secret)
	require.Contains(t, get(t, open.URL+record+"&reveal=1").body, consoletest.Secret)
}

// Behind a reverse proxy under a path prefix, every link carries it.
func TestServedUnderAPrefix(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	consoletest.Seed(t, db)
	con, err := console.New(db.Pool, &console.Config{Schema: db.Schema, Prefix: "/ops/oncekit"})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/ops/oncekit/", con)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	p := get(t, srv.URL+"/ops/oncekit/")
	require.Equal(t, http.StatusOK, p.status)
	require.Contains(t, p.body, `href="/ops/oncekit/static/console.css"`)
	require.Contains(t, p.body, `href="/ops/oncekit/chain"`)
	require.Equal(t, http.StatusOK, get(t, srv.URL+"/ops/oncekit/static/console.js").status)
}

func TestConfigIsChecked(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	for _, cfg := range []console.Config{
		{Writes: true}, // nobody could act
		{Writes: true, Operators: map[string]string{"ana": "short"}},
		{Prefix: "ops"},
		{Schema: "bad schema"},
	} {
		_, err := console.New(db.Pool, &cfg)
		require.ErrorIs(t, err, console.ErrInvalidConfig, "%+v", cfg)
	}
}

func basic(user, pw string) string {
	req, _ := http.NewRequest(http.MethodGet, "/", nil)
	req.SetBasicAuth(user, pw)
	return strings.TrimPrefix(req.Header.Get("Authorization"), "Basic ")
}

// A group of dead letters is replayed after a dry run that says how many
// and which; the replay republishes each with its message's ID, through the
// broker, and is audited.
func TestReplayAGroupAfterADryRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc := testenv.NewNATS(t)
	_, err := natsjs.EnsureStream(ctx, nc.JS, natsjs.StreamConfig{Name: "PAYMENTS", Subjects: []string{"payments.>"}})
	require.NoError(t, err)
	pub, err := natsjs.NewPublisher(nc.Conn, nil)
	require.NoError(t, err)
	srv, db, _ := server(t, console.Config{Writes: true, Operators: map[string]string{operator: password}, Publisher: pub})
	for i, reason := range []string{"smtp: 550 mailbox of user 99 is full", "smtp: 550 mailbox of user 7 is full", "template: missing field"} {
		_, err := db.Pool.Exec(ctx, `INSERT INTO dead_letters (consumer, message_id, subject, payload, reason, attempts)
			VALUES ('mailer', $1, 'payments.created', '{}', $2, 5)`, uuid.NewString(), reason)
		require.NoError(t, err, i)
	}
	inboxPage := get(t, srv.URL+"/inbox").body
	groups := regexp.MustCompile(`name="group" value="([0-9a-f]+)"`).FindAllStringSubmatch(inboxPage, -1)
	require.Len(t, groups, 2, "the mailbox errors are one group, the template error another")
	group := groups[0][1] // the largest first

	f := url.Values{"consumer": {"mailer"}, "group": {group}}
	dry := post(t, srv, "/inbox/replay", f, true, nil)
	require.Equal(t, http.StatusOK, dry.status)
	require.Contains(t, dry.body, "replay 3 dead letters of mailer")
	require.Equal(t, 3, strings.Count(dry.body, "<li>dead letter "))
	require.Equal(t, 4, count(t, db, `SELECT count(*) FROM dead_letters WHERE replayed_at IS NULL`), "a dry run changes nothing")

	f.Set("confirm", "yes")
	require.Equal(t, http.StatusSeeOther, post(t, srv, "/inbox/replay", f, true, nil).status)
	require.Equal(t, 1, count(t, db, `SELECT count(*) FROM dead_letters WHERE replayed_at IS NULL`), "the other group waits")
	stream, err := nc.JS.Stream(ctx, "PAYMENTS")
	require.NoError(t, err)
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, info.State.Msgs, "each republished once")
	require.Equal(t, 1, count(t, db, `SELECT count(*) FROM console_audit WHERE action = 'inbox.replay' AND count = 3`))
}

func count(t *testing.T, db *testenv.DB, sql string) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), sql).Scan(&n))
	return n
}

// Parameters from outside that PostgreSQL could not take as text, or too
// long, are refused with 400 before any page reads or acts on them; the
// data is untouched.
func TestHostileParametersAreRefused(t *testing.T) {
	t.Parallel()
	srv, db, s := server(t, console.Config{Writes: true, Operators: map[string]string{operator: password}})
	for _, bad := range []string{"pay\x00-1", "\xff\xfe", strings.Repeat("k", 5000)} {
		for _, path := range []string{"/chain?q=", "/chain?q=k&tenant=", "/edge/record?tenant=acme&operation=", "/edge?operation="} {
			require.Equal(t, http.StatusBadRequest, get(t, srv.URL+path+url.QueryEscape(bad)).status, "%s %q", path, bad)
		}
		f := url.Values{"id": {strconv.FormatInt(s.EffectID, 10)}, "to": {"confirmed"}, "note": {bad}, "confirm": {"yes"}}
		require.Equal(t, http.StatusBadRequest, post(t, srv, "/effects/resolve", f, true, nil).status, "%q", bad)
	}
	require.Zero(t, count(t, db, `SELECT count(*) FROM console_audit`))
	require.Equal(t, http.StatusOK, get(t, srv.URL+"/chain?q="+url.QueryEscape("päy-✓")).status, "valid UTF-8 is fine")
}

func TestEffectCountsSayWhenTheyStoppedAtTheCap(t *testing.T) {
	t.Parallel()
	srv, db, _ := server(t, console.Config{})
	for _, path := range []string{"/", "/effects"} {
		require.NotContains(t, get(t, srv.URL+path).body, `id="effects-capped"`, path)
	}
	_, err := db.Pool.Exec(context.Background(), `
		INSERT INTO side_effects (source_id, kind, idempotency_key, next_attempt_at)
		SELECT 'outage-' || g, 'capture', 'outage-' || g, now() FROM generate_series(1, $1) g`, report.LiveCap)
	require.NoError(t, err)
	for _, path := range []string{"/", "/effects"} {
		require.Contains(t, get(t, srv.URL+path).body, `id="effects-capped"`, path)
	}
}

// The overview and the outbox page show the logical relay's slot when the
// schema runs in logical mode: here its publication and its record in
// logical_slots without the slot, a dropped slot, which is lost; without
// logical mode no slot is shown.
func TestPagesShowTheLogicalSlot(t *testing.T) {
	t.Parallel()
	srv, db, _ := server(t, console.Config{})
	for _, path := range []string{"/", "/outbox"} {
		body := get(t, srv.URL+path).body
		require.NotContains(t, body, `id="slot"`, path)
		require.NotContains(t, body, "WAL messages", path)
	}
	_, err := db.Pool.Exec(context.Background(), `CREATE PUBLICATION `+pgx.Identifier{"oncekit_" + db.Schema}.Sanitize())
	require.NoError(t, err)
	_, err = db.Pool.Exec(context.Background(), `INSERT INTO `+pgx.Identifier{db.Schema, "logical_slots"}.Sanitize()+` (slot) VALUES ($1)`, "oncekit_"+db.Schema)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), `DROP PUBLICATION IF EXISTS `+pgx.Identifier{"oncekit_" + db.Schema}.Sanitize())
	})
	for _, path := range []string{"/", "/outbox"} {
		p := get(t, srv.URL+path)
		require.Equal(t, http.StatusOK, p.status, p.body)
		require.Contains(t, p.body, `id="slot"`, path)
		require.Contains(t, p.body, "lost, dropped: the relay stops", path)
		require.Contains(t, p.body, "in logical mode the events are WAL messages", path)
	}
	require.Contains(t, get(t, srv.URL+"/").body, `id="slot-card"`)
}
