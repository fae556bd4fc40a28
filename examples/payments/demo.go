package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/drift"
	"github.com/oncekit/oncekit/idempotency"
)

// runDemo runs every role in this process against the local PostgreSQL and
// NATS (an embedded NATS server when none answers), sends a few payments the
// way an unreliable network delivers them, and tells what each layer did.
func runDemo(ctx context.Context, cfg *config, args []string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if cfg.Schema == defaultSchema {
		cfg.Schema = "payments_demo"
	}
	stopNATS, err := ensureNATS(cfg)
	if err != nil {
		return err
	}
	defer stopNATS()
	return onStream(demo)(ctx, cfg, args)
}

// demo is the demo once connected to the database and the stream.
func demo(ctx context.Context, cfg *config, pool *pgxpool.Pool, js jetstream.JetStream) error {
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	if err := setupTables(ctx, pool, cfg); err != nil {
		return fmt.Errorf("%w (is PostgreSQL up? DATABASE_URL)", err)
	}
	if err := setupStream(ctx, js, 1); err != nil {
		return err
	}

	prov := newProvider(0, 0)
	prov.loseNext.Store(1) // the first execution's response never arrives
	provSrv := httptest.NewServer(prov.handler())
	defer provSrv.Close()
	cfg.ProviderURL = provSrv.URL
	api, err := newAPI(pool, cfg, quiet)
	if err != nil {
		return err
	}
	apiSrv := httptest.NewServer(api)
	defer apiSrv.Close()
	relay, err := newRelay(ctx, pool, js, cfg, quiet)
	if err != nil {
		return err
	}
	consumer, err := newConsumer(ctx, pool, js, cfg, quiet)
	if err != nil {
		return err
	}
	dispatcher, err := newDispatcher(pool, cfg, quiet)
	if err != nil {
		return err
	}
	// The daemons run until the demo ends. A daemon that stops with an error
	// cancels running, which ends the demo's waits with that error rather
	// than a minute later with a timeout.
	running, stop := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	for _, daemon := range []func(context.Context) error{relay.Run, consumer.Run, dispatcher.Run} {
		wg.Go(func() { stop(ignoreCancel(daemon(running))) })
	}
	defer func() { stop(nil); wg.Wait() }()

	run := randomHex(3)
	fmt.Printf("payments demo: schema %s, run %s\n\n1. Edge: POST /payments with an Idempotency-Key, payment and event in one transaction\n", cfg.Schema, run)
	c := &client{url: apiSrv.URL + "/payments"}
	var ids []string
	for i, step := range []struct {
		key, body, what string
	}{
		{"pay-" + run + "-1", `{"account":"acct-1","amount":1250,"currency":"EUR"}`, "first request"},
		{"pay-" + run + "-1", `{"account":"acct-1","amount":1250,"currency":"EUR"}`, "retried (response lost)"},
		{"pay-" + run + "-1", `{"currency":"EUR","amount":1250,"account":"acct-1"}`, "retried, fields reordered"},
		{"pay-" + run + "-1", `{"account":"acct-1","amount":9999,"currency":"EUR"}`, "key reused, other body"},
		{"pay-" + run + "-2", `{"account":"acct-1","amount":300,"currency":"EUR"}`, "first request"},
		{"pay-" + run + "-3", `{"account":"acct-2","amount":4200,"currency":"USD"}`, "first request"},
		{"", `{"account":"acct-2","amount":1,"currency":"USD"}`, "no key"},
	} {
		status, replayed, body, err := c.post(ctx, step.key, step.body)
		if err != nil {
			return err
		}
		fmt.Printf("   %-16s %-26s → %d %s\n", or(step.key, "-"), step.what, status, summarize(status, replayed, body))
		if i == 0 || (status == http.StatusCreated && replayed == "") {
			ids = appendNew(ids, oncekit.DeriveID(demoCaller, step.key).String())
		}
	}

	if err := waitUntil(running, func() (bool, error) {
		var confirmed, entries int
		err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+cfg.table("side_effects")+` WHERE state = 'confirmed' AND source_id = ANY($1)),
			(SELECT count(*) FROM `+cfg.table("ledger_entries")+` WHERE payment_id::text = ANY($1))`, ids).Scan(&confirmed, &entries)
		return err == nil && confirmed == 2*len(ids) && entries == len(ids), err
	}); err != nil {
		return fmt.Errorf("waiting for the chain: %w", err)
	}

	// A copy of the first event arrives as a new broker message (a replay
	// past JetStream's dedup window, a copy from another stream): the claim
	// absorbs it.
	first := oncekit.DeriveID(ids[0], "PaymentCreated")
	var payload []byte
	if err := pool.QueryRow(ctx, `SELECT payload FROM `+cfg.table("outbox")+` WHERE id = $1`, first).Scan(&payload); err != nil {
		return err
	}
	copyMsg := natsjs.NATSMsg(broker.Message{ID: first, Subject: subject, Key: "acct-1", Payload: payload})
	copyMsg.Header.Del(broker.HeaderMsgID)
	if _, err := js.PublishMsg(ctx, copyMsg); err != nil {
		return err
	}
	if err := waitUntil(running, func() (bool, error) { return consumer.Stats().Duplicates >= 1, nil }); err != nil {
		return fmt.Errorf("waiting for the copy: %w", err)
	}

	st := consumer.Stats()
	fmt.Printf("\n2. Outbox relay: %d PaymentCreated events published to JetStream, Nats-Msg-Id = event ID\n", len(ids))
	fmt.Printf("   one event also arrived again as a new broker message (a copy JetStream cannot dedup)\n")
	fmt.Printf("\n3. Inbox (durable %q, ordered by account): processed %d, duplicates absorbed by the claim %d\n", consumerName, st.Processed, st.Duplicates)
	fmt.Printf("\n4. Side effects, recorded with the ledger entry and fired by the dispatcher:\n")
	calls := prov.record()
	for _, id := range ids {
		var entries int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+cfg.table("ledger_entries")+` WHERE payment_id = $1`, id).Scan(&entries); err != nil {
			return err
		}
		fmt.Printf("   payment %s…: %d ledger entry", id[:8], entries)
		for _, kind := range []string{kindCapture, kindReceipt} {
			key := oncekit.DeriveKey(id, kind)
			n, executed, lost := 0, 0, 0
			for _, call := range calls {
				if call.Key == key {
					n++
					executed += btoi(call.Executed)
					lost += btoi(call.Outcome == "lost")
				}
			}
			fmt.Printf("; %s %d call(s), executed %d", kind, n, executed)
			if lost > 0 {
				fmt.Printf(" (first response lost, retried with key %s…)", key[:10])
			}
		}
		fmt.Println()
	}

	fmt.Printf("\n5. Drift: every payment has one capture and one receipt, and the chain is healthy\n")
	checker, err := drift.New(pool, &drift.Config{Schema: cfg.Schema, Logger: quiet, Rules: driftRules(cfg)})
	if err != nil {
		return err
	}
	rep, err := checker.Run(ctx)
	if err != nil {
		return err
	}
	if err := rep.WriteTable(os.Stdout); err != nil {
		return err
	}
	if rep.Drifted() {
		return errors.New("drift found")
	}
	fmt.Println("\ndone: each payment created once, consumed once, captured once and receipted once")
	return nil
}

// driftRules are the service's expectations: each payment has exactly one
// capture, one receipt and one ledger entry.
func driftRules(cfg *config) []drift.Rule {
	payments := `SELECT id FROM ` + cfg.table("payments")
	return []drift.Rule{
		drift.ExpectEffects("payment_captured", kindCapture, payments),
		drift.ExpectEffects("payment_receipted", kindReceipt, payments),
		{Name: "ledger_once", SQL: `SELECT 'payment ' || p.id || ' has ' || count(l.id) || ' ledger entries' FROM ` + cfg.table("payments") + ` p
			LEFT JOIN ` + cfg.table("ledger_entries") + ` l ON l.payment_id = p.id GROUP BY p.id HAVING count(l.id) <> 1`},
	}
}

// client posts payments as an HTTP client would.
type client struct{ url string }

func (c *client) post(ctx context.Context, key, body string) (status int, replayed string, respBody []byte, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewBufferString(body))
	if err != nil {
		return 0, "", nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idempotency.HeaderKey, `"`+key+`"`)
	}
	req.Header.Set("Authorization", "Bearer "+demoToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	respBody, err = io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get(idempotency.HeaderReplayed), respBody, err
}

func summarize(status int, replayed string, body []byte) string {
	switch {
	case status == http.StatusCreated && replayed == "true":
		return "replayed (Idempotent-Replayed: true), nothing executed"
	case status == http.StatusCreated:
		var p PaymentResponse
		_ = json.Unmarshal(body, &p)
		return fmt.Sprintf("created payment %s… (%s #%d)", p.ID[:8], p.Account, p.Seq)
	default:
		var problem struct{ Code string }
		if json.Unmarshal(body, &problem) == nil && problem.Code != "" {
			return problem.Code + ", not executed"
		}
		return string(bytes.TrimSpace(body))
	}
}

// ensureNATS starts an embedded JetStream server when none answers at
// cfg.NATSURL, and points cfg at it.
func ensureNATS(cfg *config) (stop func(), err error) {
	if nc, err := nats.Connect(cfg.NATSURL, nats.Timeout(2*time.Second)); err == nil {
		nc.Close()
		return func() {}, nil
	}
	dir, err := os.MkdirTemp("", "payments-nats-")
	if err != nil {
		return nil, err
	}
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		return nil, err
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		return nil, errors.New("embedded nats-server did not start")
	}
	fmt.Printf("(no NATS at %s: using an embedded server)\n", cfg.NATSURL)
	cfg.NATSURL = srv.ClientURL()
	return func() { srv.Shutdown(); _ = os.RemoveAll(dir) }, nil
}

// waitUntil polls cond every 50 ms until it holds or a minute passes.
func waitUntil(ctx context.Context, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return errors.Join(context.Cause(ctx), last)
		case <-t.C:
		}
	}
}

func appendNew(ids []string, id string) []string {
	for _, have := range ids {
		if have == id {
			return ids
		}
	}
	return append(ids, id)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
