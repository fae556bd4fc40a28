package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/migrations"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/sideeffect"
)

// daemonProc is an oncekit daemon run from the built binary.
type daemonProc struct {
	cmd  *exec.Cmd
	out  *testenv.SyncBuffer
	done chan error
}

// startOncekit runs the oncekit binary with args and vars as its
// environment (beside PATH and HOME), until the test ends: SIGTERM, then a
// clean exit is required, with no statement refused for a missing grant
// on the way (the relay's goodbye deletes its node row).
func startOncekit(t *testing.T, vars map[string]string, args ...string) *daemonProc {
	t.Helper()
	d := &daemonProc{out: &testenv.SyncBuffer{}, done: make(chan error, 1)}
	d.cmd = exec.Command(testenv.OncekitBinary(t), args...)
	d.cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range vars {
		d.cmd.Env = append(d.cmd.Env, k+"="+v)
	}
	d.cmd.Stdout, d.cmd.Stderr = d.out, d.out
	require.NoError(t, d.cmd.Start())
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-d.done:
			require.NoError(t, err, "oncekit %s: %s", args[0], d.out)
			noPermissionDenied(t, "oncekit "+args[0], d.out.String())
		case <-time.After(30 * time.Second):
			_ = d.cmd.Process.Kill()
			t.Errorf("oncekit %s did not stop on SIGTERM", args[0])
		}
	})
	return d
}

// roleVars is the environment of a command run as role on db's schema.
func roleVars(db *testenv.DB, role *testenv.Role, natsURL string) map[string]string {
	return map[string]string{"DATABASE_URL": role.URL, "ONCEKIT_SCHEMA": db.Schema, "NATS_URL": natsURL}
}

// rolePool is a pool logged in as role.
func rolePool(t *testing.T, role *testenv.Role) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), role.URL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// grantRole makes a role and grants it, through `oncekit migrate grant` run
// as the schema's owner, what components need.
func grantRole(t *testing.T, db *testenv.DB, components ...migrations.Component) *testenv.Role {
	t.Helper()
	role := testenv.NewRole(t, db)
	names := make([]string, len(components))
	for i, c := range components {
		names[i] = string(c)
	}
	code, out, stderr := cli(t, dbVars(db), "migrate", "grant", "--role", role.Name, "--for", strings.Join(names, ","))
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "granted to "+role.Name)
	return role
}

// noPermissionDenied fails the test when a daemon's output shows a
// statement the role was not allowed.
func noPermissionDenied(t *testing.T, what, out string) {
	t.Helper()
	require.NotContains(t, out, "permission denied", "%s ran into a missing grant:\n%s", what, out)
	require.NotContains(t, out, "42501", "%s ran into a missing grant:\n%s", what, out)
}

// Every component runs under a role of its own that holds only what
// `oncekit migrate grant --for` gave it (no superuser, no CREATE, no
// REPLICATION), each doing real work: a producer enqueues and records, the
// relay publishes, the consumer applies and dead-letters, the dispatcher
// calls, the edge runs and replays a request, the console shows its pages
// and, with writes, unparks, replays, resolves an effect and an edge
// record, and drift and status run their checks.
//
// It runs on a cluster of its own: roles are the cluster's, and the relay
// reads only what every transaction of the cluster has passed.
func TestEveryComponentRunsUnderItsOwnLeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := pgcluster.StartForTest(ctx, t, pgcluster.Options{})
	db := testenv.NewDBOn(t, pg.URL("postgres"))
	nats := testenv.NewNATS(t)
	roles := map[migrations.Component]*testenv.Role{}
	for _, c := range []migrations.Component{migrations.Producer, migrations.Relay, migrations.Consumer, migrations.Dispatcher,
		migrations.Edge, migrations.Console, migrations.ConsoleWrite, migrations.Drift} {
		roles[c] = grantRole(t, db, c)
		var super, create, repl bool
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT r.rolsuper, r.rolreplication,
			has_schema_privilege(r.oid, $2, 'CREATE') OR has_database_privilege(r.oid, current_database(), 'CREATE')
			FROM pg_roles r WHERE r.rolname = $1`, roles[c].Name, db.Schema).Scan(&super, &repl, &create))
		require.False(t, super || create || repl, "%s: superuser %v, CREATE %v, REPLICATION %v", c, super, create, repl)
	}

	// A producer enqueues 21 events, one a poison message and one the
	// broker refuses, and records two effects.
	stream := strings.ToUpper(testenv.Name(t))
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	ledger, err := sideeffect.New(&sideeffect.Config{Schema: db.Schema})
	require.NoError(t, err)
	var ids []uuid.UUID
	var mail, sms sideeffect.Recorded
	require.NoError(t, pgx.BeginFunc(ctx, rolePool(t, roles[migrations.Producer]), func(tx pgx.Tx) error {
		var msgs []broker.Message
		for i := range 20 {
			payload := fmt.Sprintf(`{"n":%d}`, i)
			if i == 7 {
				payload = "poison"
			}
			msgs = append(msgs, broker.Message{ID: uuid.New(), Subject: stream + ".order", Key: fmt.Sprint(i % 3), Payload: []byte(payload)})
			ids = append(ids, msgs[i].ID)
		}
		// One the broker refuses (no stream has its subject): the relay parks
		// it.
		msgs = append(msgs, broker.Message{ID: uuid.New(), Subject: "NOSTREAM." + stream, Payload: []byte("{}")})
		ids = append(ids, msgs[20].ID)
		if _, err := ob.Enqueue(ctx, tx, msgs...); err != nil {
			return err
		}
		if mail, err = ledger.Record(ctx, tx, sideeffect.Effect{SourceID: "order-1", Kind: "mail"}); err != nil {
			return err
		}
		sms, err = ledger.Record(ctx, tx, sideeffect.Effect{SourceID: "order-1", Kind: "sms"})
		return err
	}))

	// The relay publishes 20 and parks the one refused.
	relay := startOncekit(t, roleVars(db, roles[migrations.Relay], nats.URL), "relay", "--stream", stream,
		"--subjects", stream+".>", "--duplicates", "100ms", "--poll-interval", "50ms", "--lease", "3s", "--max-attempts", "1")
	var published uint64
	defer func() {
		if t.Failed() {
			rows, _ := db.Pool.Query(ctx, `SELECT partition, txid::text, seq, parked_at IS NOT NULL, next_attempt_at IS NOT NULL, last_error FROM outbox`)
			dump, _ := pgx.CollectRows(rows, pgx.RowToMap)
			t.Logf("published %d; outbox %v", published, dump)
			rows, _ = db.Pool.Query(ctx, `SELECT partition, owner, cursor_txid::text, cursor_seq FROM relay_partitions`)
			dump, _ = pgx.CollectRows(rows, pgx.RowToMap)
			t.Logf("partitions %v", dump)
		}
	}()
	require.Eventually(t, func() bool {
		if s, err := nats.JS.Stream(ctx, stream); err == nil {
			if info, err := s.Info(ctx); err == nil {
				published = info.State.Msgs
			}
		}
		return published == 20
	}, 30*time.Second, 20*time.Millisecond, "the relay did not publish the 20 events: %s", relay.out)
	var parkedAt time.Time
	require.Eventually(t, func() bool {
		var at *time.Time
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT parked_at FROM outbox WHERE id = $1`, ids[20]).Scan(&at))
		if at != nil {
			parkedAt = *at
		}
		return at != nil
	}, 30*time.Second, 20*time.Millisecond, "the relay did not park the refused event: %s", relay.out)

	// The relay's retention pass (every minute in the daemon) runs too.
	np, err := natsjs.NewPublisher(nats.Conn, nil)
	require.NoError(t, err)
	pruner, err := outbox.NewRelay(rolePool(t, roles[migrations.Relay]), ob, np, &outbox.RelayConfig{})
	require.NoError(t, err)
	_, err = pruner.Prune(ctx)
	require.NoError(t, err)

	// The consumer applies 19 and dead-letters the poison message.
	src, err := natsjs.NewSource(ctx, nats.JS, &natsjs.SourceConfig{Stream: stream, Durable: "billing"})
	require.NoError(t, err)
	t.Cleanup(src.Close)
	var applied sync.Map // a batch's handlers run again when the batch is redone without a failed message
	consumer, err := inbox.NewConsumer(rolePool(t, roles[migrations.Consumer]), src,
		inbox.HandlerFunc(func(_ context.Context, _ pgx.Tx, msg *inbox.Message) error {
			if string(msg.Payload) == "poison" {
				return inbox.Permanent(errors.New("undecodable"))
			}
			applied.Store(msg.ID, true)
			return nil
		}), &inbox.Config{Name: "billing", Schema: db.Schema, BatchSize: 8})
	require.NoError(t, err)
	cctx, stopConsumer := context.WithCancel(ctx)
	consumed := make(chan error, 1)
	go func() { consumed <- consumer.Run(cctx) }()
	var claims, dead int
	require.Eventually(t, func() bool {
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM processed_messages WHERE consumer = 'billing'),
			(SELECT count(*) FROM dead_letters WHERE consumer = 'billing')`).Scan(&claims, &dead))
		return claims == 19 && dead == 1
	}, 30*time.Second, 20*time.Millisecond, "claims %d, dead letters %d", claims, dead)
	n := 0
	applied.Range(func(any, any) bool { n++; return true })
	require.Equal(t, 19, n)
	_, err = consumer.PruneDeadLetters(ctx) // the consumer's retention statements
	require.NoError(t, err)
	_, err = consumer.Prune(ctx)
	require.NoError(t, err)
	// A retention pass that finds claims to delete (the consumer's is a
	// week).
	store, err := inbox.NewStore(db.Schema)
	require.NoError(t, err)
	pruned, err := store.PruneClaims(ctx, rolePool(t, roles[migrations.Consumer]), "billing", time.Now().Add(time.Hour), 0)
	require.NoError(t, err)
	require.EqualValues(t, 19, pruned)
	stopConsumer()
	require.NoError(t, <-consumed)

	// The dispatcher calls the mail endpoint and confirms the effect.
	var calls atomic.Int64
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(provider.Close)
	dispatcher := startOncekit(t, roleVars(db, roles[migrations.Dispatcher], nats.URL), "dispatch",
		"--endpoint", "mail="+provider.URL, "--unsigned", "--poll-interval", "20ms", "--listen", "")
	var state string
	require.Eventually(t, func() bool {
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT state FROM side_effects WHERE id = $1`, mail.ID).Scan(&state))
		return state == "confirmed"
	}, 30*time.Second, 20*time.Millisecond, "effect %s: %s", state, dispatcher.out)
	require.EqualValues(t, 1, calls.Load())
	// The dispatcher's retention pass (daily in the daemon) runs too, here
	// on everything settled.
	pruned, err = ledger.Prune(ctx, rolePool(t, roles[migrations.Dispatcher]), time.Now().Add(time.Hour), 100)
	require.NoError(t, err)
	require.EqualValues(t, 1, pruned, "the confirmed effect")

	// The edge runs a request once and replays its retry.
	edge, err := idempotency.New(rolePool(t, roles[migrations.Edge]), &idempotency.Config{Schema: db.Schema})
	require.NoError(t, err)
	mw, err := edge.Route(&idempotency.Route{Operation: "create-order", SharedScope: true, BusinessKey: &idempotency.BusinessKey{Of: func(*http.Request, []byte) (string, error) {
		return "order-1", nil
	}}})
	require.NoError(t, err)
	var runs atomic.Int64
	front := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		runs.Add(1)
		w.Header().Set("Location", "/orders/1")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":1}`)
	})))
	t.Cleanup(front.Close)
	for range 2 {
		req, err := http.NewRequest(http.MethodPost, front.URL+"/orders", strings.NewReader(`{"sku":"a"}`))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "order-key-1")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
		require.JSONEq(t, `{"id":1}`, string(body))
	}
	require.EqualValues(t, 1, runs.Load(), "the retry is replayed")
	_, err = edge.Prune(ctx) // the edge's retention statements
	require.NoError(t, err)

	// The read-only console shows every page.
	con := startOncekit(t, roleVars(db, roles[migrations.Console], nats.URL), "console", "--listen", "127.0.0.1:0")
	consolePages(t, consoleBase(t, con), ids[0])

	// The console with writes: unpark the parked event, replay the dead
	// letter, resolve an unknown effect and an unknown edge record (the
	// owner puts those two in that state).
	_, err = db.Pool.Exec(ctx, `UPDATE side_effects SET state = 'unknown', last_error = 'timeout', next_attempt_at = NULL WHERE id = $1`, sms.ID)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO idempotency_keys (tenant, operation, key, fingerprint, state, unknown_reason, expires_at)
		VALUES ('acme', 'create-payment', $1, '\x00', 'unknown', 'charge: EOF', now() + interval '1 day')`, idempotency.StoredKey("pay-1"))
	require.NoError(t, err)
	var deadID int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT id FROM dead_letters`).Scan(&deadID))
	vars := roleVars(db, roles[migrations.ConsoleWrite], nats.URL)
	vars["ONCEKIT_CONSOLE_OPERATORS"] = "ana:a-long-enough-password"
	wcon := startOncekit(t, vars, "console", "--listen", "127.0.0.1:0", "--writes", "--replay")
	wbase := consoleBase(t, wcon)
	consolePages(t, wbase, ids[0])
	for path, form := range map[string]url.Values{
		"/outbox/unpark":   {"id": {ids[20].String()}},
		"/inbox/replay":    {"id": {fmt.Sprint(deadID)}},
		"/effects/resolve": {"id": {fmt.Sprint(sms.ID)}, "to": {"failed"}},
		"/edge/resolve": {"tenant": {"acme"}, "operation": {"create-payment"}, "stored_key": {idempotency.StoredKey("pay-1")},
			"to": {"released"}},
	} {
		form.Set("confirm", "yes")
		form.Set("note", "least-privilege test")
		req, err := http.NewRequest(http.MethodPost, wbase+path, strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.SetBasicAuth("ana", "a-long-enough-password")
		resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusSeeOther, resp.StatusCode, "%s: %s", path, body)
	}
	// The relay tries the unparked event again, and parks it again.
	require.Eventually(t, func() bool {
		var at *time.Time
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT parked_at FROM outbox WHERE id = $1`, ids[20]).Scan(&at))
		return at != nil && at.After(parkedAt)
	}, 30*time.Second, 20*time.Millisecond, "the relay did not try the unparked event again: %s", relay.out)
	var audited int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM console_audit WHERE operator = 'ana'`).Scan(&audited))
	require.Equal(t, 4, audited)

	// Drift and status run every check.
	code, out, stderr := cli(t, roleVars(db, roles[migrations.Drift], nats.URL), "drift")
	require.NotEqual(t, exitCheckError, code, "%s%s", out, stderr)
	noPermissionDenied(t, "drift", out+stderr)
	code, out, stderr = cli(t, roleVars(db, roles[migrations.Drift], nats.URL), "status")
	require.Equal(t, 0, code, "%s%s", out, stderr)
	noPermissionDenied(t, "status", out+stderr)
}

// consolePages gets every page of the console at base.
func consolePages(t *testing.T, base string, event uuid.UUID) {
	t.Helper()
	for _, page := range []string{"/", "/outbox", "/outbox?state=published", "/inbox", "/effects", "/edge", "/drift", "/audit",
		"/chain?q=" + event.String(), "/inbox/dead/1"} {
		resp, err := http.Get(base + page)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", page, body)
		noPermissionDenied(t, "console page "+page, string(body))
	}
}

// consoleBase waits for a console daemon to say where it serves.
func consoleBase(t *testing.T, d *daemonProc) string {
	t.Helper()
	served := regexp.MustCompile(`console on (http://[^/\s]+)/`)
	var base string
	require.Eventually(t, func() bool {
		if m := served.FindStringSubmatch(d.out.String()); m != nil {
			base = m[1]
		}
		return base != ""
	}, 30*time.Second, 10*time.Millisecond, "the console did not start: %s", d.out)
	return base
}

// A role missing one grant stops each daemon at start, before it does any
// work, with the privilege, the table and the command that grants it; the
// process exits (1, drift 3) instead of retrying statement after statement.
func TestDaemonWithARoleMissingOneGrantStopsNamingIt(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	nats := testenv.NewNATS(t)
	ctx := context.Background()
	revoke := func(role *testenv.Role, priv, table string) {
		_, err := db.Pool.Exec(ctx, fmt.Sprintf(`REVOKE %s ON %q.%s FROM %q`, priv, db.Schema, table, role.Name))
		require.NoError(t, err)
	}
	want := func(role *testenv.Role, missing, needs, component string) string {
		return fmt.Sprintf(`role %q lacks %s, which %s needs: as the schema's owner, run `+
			"`oncekit migrate grant --schema %s --role %s --for %s`", role.Name, missing, needs, db.Schema, role.Name, component)
	}
	binary := func(role *testenv.Role, args ...string) (int, string) {
		bin := testenv.OncekitBinary(t) // built before the clock starts
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		cmd := exec.CommandContext(cctx, bin, args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "DATABASE_URL=" + role.URL, "ONCEKIT_SCHEMA=" + db.Schema, "NATS_URL=" + nats.URL}
		start := time.Now()
		out, err := cmd.CombinedOutput()
		require.NoError(t, cctx.Err(), "oncekit %s kept running: %s", args[0], out)
		t.Logf("oncekit %s exited after %v", args[0], time.Since(start).Round(time.Millisecond))
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "%s", out)
		return exit.ExitCode(), string(out)
	}

	relay := grantRole(t, db, migrations.Relay)
	revoke(relay, "UPDATE", "relay_partitions")
	code, out := binary(relay, "relay")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "oncekit relay: "+want(relay, `UPDATE on "`+db.Schema+`".relay_partitions`, "the relay", "relay"))
	t.Logf("relay: exit %d: %s", code, out)
	var rows int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM relay_nodes`).Scan(&rows))
	require.Zero(t, rows, "the relay did no work")

	dispatcher := grantRole(t, db, migrations.Dispatcher)
	revoke(dispatcher, "DELETE", "side_effects")
	code, out = binary(dispatcher, "dispatch", "--endpoint", "mail=http://127.0.0.1:1", "--unsigned", "--listen", "")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "oncekit dispatch: "+want(dispatcher, `DELETE on "`+db.Schema+`".side_effects`, "the dispatcher", "dispatcher"))
	t.Logf("dispatch: exit %d: %s", code, out)

	console := grantRole(t, db, migrations.ConsoleWrite)
	revoke(console, "INSERT", "console_audit")
	vars := roleVars(db, console, nats.URL)
	vars["ONCEKIT_CONSOLE_OPERATORS"] = "ana:a-long-enough-password"
	code, _, stderr := cli(t, vars, "console", "--writes", "--listen", "127.0.0.1:0")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "oncekit console: "+want(console, `INSERT on "`+db.Schema+`".console_audit`, "the console with writes", "console-write"))
	t.Logf("console --writes: exit %d: %s", code, stderr)

	drift := grantRole(t, db, migrations.Drift)
	revoke(drift, "SELECT", "relay_nodes")
	code, _, stderr = cli(t, roleVars(db, drift, nats.URL), "drift")
	require.Equal(t, exitCheckError, code, stderr)
	require.Contains(t, stderr, "oncekit drift: could not run: "+want(drift, `SELECT on "`+db.Schema+`".relay_nodes`, "drift", "drift"))
	t.Logf("drift: exit %d: %s", code, stderr)

	// The inbox consumer, in a service: Run returns at once.
	consumerRole := grantRole(t, db, migrations.Consumer)
	revoke(consumerRole, "INSERT", "processed_messages")
	stream := strings.ToUpper(testenv.Name(t))
	_, err := natsjs.EnsureStream(ctx, nats.JS, natsjs.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}})
	require.NoError(t, err)
	src, err := natsjs.NewSource(ctx, nats.JS, &natsjs.SourceConfig{Stream: stream, Durable: "billing"})
	require.NoError(t, err)
	t.Cleanup(src.Close)
	consumer, err := inbox.NewConsumer(rolePool(t, consumerRole), src, inbox.HandlerFunc(func(context.Context, pgx.Tx, *inbox.Message) error {
		return nil
	}), &inbox.Config{Name: "billing", Schema: db.Schema})
	require.NoError(t, err)
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = consumer.Run(rctx)
	require.NoError(t, rctx.Err(), "the consumer kept running")
	var missing *migrations.MissingGrantError
	require.ErrorAs(t, err, &missing)
	require.EqualError(t, err, want(consumerRole, `INSERT on "`+db.Schema+`".processed_messages`, "the inbox consumer", "consumer")+
		" (add --sql to print the statements instead)")
	t.Logf("inbox.Consumer.Run: %v", err)

	// Granting to a role that does not exist says so, and grants nothing.
	code, _, stderr = cli(t, dbVars(db), "migrate", "grant", "--role", "no_such_role_oncekit", "--for", "relay")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, `role "no_such_role_oncekit" does not exist`)
	t.Logf("migrate grant: exit %d: %s", code, stderr)

	// A role granted nothing is told about the schema first.
	bare := testenv.NewRole(t, db)
	code, _, stderr = cli(t, roleVars(db, bare, nats.URL), "status")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, fmt.Sprintf(`oncekit status: role %q lacks USAGE on schema "%s", SELECT on "%s".outbox, `, bare.Name, db.Schema, db.Schema))
	require.NotContains(t, stderr, "SQLSTATE")
	t.Logf("status: exit %d: %s", code, stderr)
}
