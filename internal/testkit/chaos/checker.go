package chaos

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/outbox"
)

// The invariants the checker holds the run to, by the names a failed verdict
// reports.
const (
	InvAckedExists     = "acknowledged_payment_exists" // every ok operation's payment exists
	InvBodyMatches     = "payment_matches_request"     // with the body the client sent under its key
	InvFailedNotRun    = "failed_request_not_executed" // a definite failure created nothing
	InvReuseRefused    = "reused_key_not_executed"     // a key reused with another body was refused
	InvRekeyAnswered   = "new_key_not_executed"        // a payment sent again under a new key made no second payment
	InvResponseStored  = "response_stored"             // every payment's key holds its stored 2xx response
	InvHasRequest      = "payment_has_request"         // no payment the clients never asked for
	InvLedgerOnce      = "ledger_exactly_once"         // one ledger entry per payment
	InvEffectOnce      = "effect_executed_once"        // the provider acted once per (payment, kind)
	InvKeyStable       = "effect_key_stable"           // every call for it carried the derived key
	InvCallRecorded    = "call_recorded_first"         // no attempt number sent twice: each attempt committed before its call
	InvInStream        = "published_in_stream"         // every event the outbox marked published is in the stream
	InvPublishOrder    = "publish_order"               // the relay published an account's events in outbox order
	InvOrder           = "per_account_order"           // the consumer applied them in stream order
	InvEffectsSettled  = "effects_settled"             // nothing pending, fired, unknown or failed
	InvOutboxDrained   = "outbox_drained"              // nothing unpublished or parked
	InvEdgeSettled     = "edge_settled"                // no request in progress
	InvNoDeadLetters   = "no_dead_letters"             // no message given up on, but the hostile ones
	InvHostileSettled  = "hostile_dead_lettered_once"  // every hostile message in exactly one dead letter
	InvDriftClean      = "drift_clean"                 // `oncekit drift` exits 0
	InvNoPhantoms      = "no_phantom_events"           // no event, ledger entry or call for a payment that does not exist
	InvNoLostEffects   = "no_lost_effects"             // every event in the stream whose payment exists was applied
	effectKindCapture  = "provider.capture"
	effectKindReceipt  = "receipt.email"
	maxExamplesPerRule = 5
)

// ProviderCall is one call the fake payment provider received, as it
// reports them on GET /calls.
type ProviderCall struct {
	Kind      string    `json:"kind"`
	Key       string    `json:"key"`
	PaymentID string    `json:"payment_id"`
	Executed  bool      `json:"executed"`
	Outcome   string    `json:"outcome"`
	Attempt   string    `json:"attempt"` // the Oncekit-Attempt header
	At        time.Time `json:"at"`
}

// Verdict is what the checker found.
type Verdict struct {
	Ops, OK, Failed, Unknown, Reused, Rekeyed int
	Payments, LedgerEntries                   int
	ProviderCalls, Executions                 int
	Lost, DuplicateEffects                    int
	// After failovers: payments the survivor does not hold that were
	// published (Phantoms) or acted on by the consumer or the provider
	// (PhantomEffects, by payment); payments that exist whose event is in the stream
	// and that the consumer never applied (LostEffects: its claim was
	// erased after it acknowledged the broker); and acknowledged payments
	// the survivor does not hold (Erased: gone with their transaction).
	Phantoms, PhantomEffects, LostEffects, Erased int
	MismatchedKeys, OrderViolations               int
	// Payments whose key holds no stored success, and attempt numbers the
	// provider received more than once.
	MissingResponses, RepeatedAttempts int
	// Hostile traffic: malformed messages published (acknowledged, and
	// sent without an answer), their dead letters, and the provider's
	// refusals, each answered with an error page that is not UTF-8.
	HostileSent, HostileMaybe, HostileDeadLettered, GarbageErrorPages int
	// Violations holds, per violated invariant, a few examples.
	Violations map[string][]string
	violated   map[string]int
	// Consequences counts, after an asynchronous failover, the breaks of
	// the invariants such a failover breaks by itself (erasable), by
	// invariant, with a few examples in Violations.
	Consequences map[string]int
	erasable     map[string]bool
	ackedMissing int // acknowledged payments the database does not hold
}

// erasureBreaks are the invariants an asynchronous failover breaks by
// itself, whatever the services do. A payment acknowledged and then erased
// frees its key and its reference: a later request under the key with
// another body, or the same payment under a new key, runs as new
// (reused_key_not_executed, new_key_not_executed, payment_has_request,
// payment_matches_request). An event published and then erased keeps its
// place in the stream when its payment is made again under the same key
// (the event ID is derived, and the broker drops the second copy), so the
// account's later events follow it in the outbox and precede it in the
// stream (publish_order); the replay applies erased messages after later
// ones of their account (per_account_order). An attempt recorded and then
// erased is sent again under its number (call_recorded_first; the
// provider's key still keeps each effect to one execution).
var erasureBreaks = []string{InvReuseRefused, InvRekeyAnswered, InvHasRequest, InvBodyMatches, InvPublishOrder, InvOrder, InvCallRecorded}

// Pass reports whether every invariant held.
func (v *Verdict) Pass() bool { return len(v.violated) == 0 }

// Violated lists the violated invariants, sorted.
func (v *Verdict) Violated() []string {
	return slices.Sorted(maps.Keys(v.violated))
}

func (v *Verdict) fail(inv, format string, args ...any) {
	if v.violated == nil {
		v.violated, v.Violations = map[string]int{}, map[string][]string{}
	}
	if v.erasable[inv] {
		if v.Consequences == nil {
			v.Consequences = map[string]int{}
		}
		v.Consequences[inv]++
		if len(v.Violations[inv]) < maxExamplesPerRule {
			v.Violations[inv] = append(v.Violations[inv], fmt.Sprintf(format, args...))
		}
		return
	}
	v.violated[inv]++
	if len(v.Violations[inv]) < maxExamplesPerRule {
		v.Violations[inv] = append(v.Violations[inv], fmt.Sprintf(format, args...))
	}
}

type payment struct {
	account string
	seq     int64
	amount  int64
}

// CheckOptions say how the run was made.
type CheckOptions struct {
	// Logical says the events went through the WAL (the logical relay),
	// which keeps no outbox rows to order them by.
	Logical bool
	// Erasable says the database failed over asynchronously: the survivor
	// may lack the last transactions the old primary committed. Payments
	// it lost are then counted (Erased, Phantoms, PhantomEffects) rather
	// than failed; lost effects still fail.
	Erasable bool
}

// Check holds the drained system to the history: what clients were told,
// what the database and the stream hold, and what the provider saw. The
// database it reads is the survivor: after failovers, the last primary.
func Check(ctx context.Context, pool *pgxpool.Pool, schema string, opt CheckOptions, ops []Op, calls []ProviderCall, stream []StreamEvent, hostile *Hostile) (*Verdict, error) {
	v := &Verdict{Ops: len(ops), ProviderCalls: len(calls)}
	if opt.Erasable {
		v.erasable = map[string]bool{}
		for _, inv := range erasureBreaks {
			v.erasable[inv] = true
		}
	}
	for _, c := range calls {
		if c.Outcome == "refused" {
			v.GarbageErrorPages++
		}
	}
	t := func(name string) string { return `"` + schema + `".` + name }
	ob, err := outbox.New(&outbox.Config{Schema: schema})
	if err != nil {
		return nil, err
	}

	payments := map[string]payment{}
	rows, err := pool.Query(ctx, `SELECT id::text, account, seq, amount FROM `+t("payments"))
	if err != nil {
		return nil, fmt.Errorf("read payments: %w", err)
	}
	var id string
	var p payment
	_, err = pgx.ForEachRow(rows, []any{&id, &p.account, &p.seq, &p.amount}, func() error {
		payments[id] = p
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read payments: %w", err)
	}
	v.Payments = len(payments)

	checkOps(v, opt.Erasable, ops, payments)
	if err := checkResponses(ctx, v, pool, t, ops, payments); err != nil {
		return nil, err
	}
	phantoms := checkPhantoms(v, opt.Erasable, ops, payments, stream)
	if err := checkLedger(ctx, v, pool, t, opt.Logical, payments, stream, phantoms); err != nil {
		return nil, err
	}
	checkProvider(v, calls, payments, phantoms)
	if err := checkHostile(ctx, v, pool, schema, hostile); err != nil {
		return nil, err
	}
	if err := checkSettled(ctx, v, pool, ob, t); err != nil {
		return nil, err
	}
	return v, nil
}

// checkOps: acknowledged payments exist with their body, definite failures
// and reused keys executed nothing, and every payment was asked for.
func checkOps(v *Verdict, erasable bool, ops []Op, payments map[string]payment) {
	asked := map[string]bool{}
	for _, op := range ops {
		id := oncekit.DeriveID(apiCaller, op.Key).String()
		p, exists := payments[id]
		switch op.Outcome {
		case OK:
			v.OK++
		case Failed:
			v.Failed++
		default:
			v.Unknown++
		}
		if op.Reuse {
			v.Reused++
			if op.Outcome == OK || (exists && p.amount == op.Amount) {
				v.fail(InvReuseRefused, "key %s reused with amount %d: HTTP %d, stored amount %d", op.Key, op.Amount, op.Status, p.amount)
			}
			continue
		}
		if op.RekeyOf != "" {
			v.Rekeyed++
			original := oncekit.DeriveID(apiCaller, op.RekeyOf).String()
			if _, made := payments[original]; exists || !made {
				v.fail(InvRekeyAnswered, "payment of key %s sent again under key %s (HTTP %d): second payment %t, first payment %s exists %t",
					op.RekeyOf, op.Key, op.Status, exists, original, made)
			}
			continue
		}
		asked[id] = true
		switch {
		case op.Outcome == OK && !exists && erasable:
			v.Erased++
			v.ackedMissing++
		case op.Outcome == OK && !exists:
			v.ackedMissing++
			v.Lost++
			v.fail(InvAckedExists, "key %s acknowledged (HTTP %d) but payment %s does not exist", op.Key, op.Status, id)
		case op.Outcome == Failed && exists:
			v.fail(InvFailedNotRun, "key %s failed (HTTP %d) but payment %s exists", op.Key, op.Status, id)
		case exists && (p.account != op.Account || p.amount != op.Amount):
			v.fail(InvBodyMatches, "payment %s holds %s/%d, key %s sent %s/%d", id, p.account, p.amount, op.Key, op.Account, op.Amount)
		}
	}
	for id := range payments {
		if !asked[id] {
			v.fail(InvHasRequest, "payment %s matches no request", id)
		}
	}
}

// checkResponses: every payment's key holds the response the edge stored
// with it, a success. The edge stores it in the handler's transaction, so
// the two commit together; a payment without one was made by a handler
// whose answer no retry can replay, and a retry runs the handler again.
func checkResponses(ctx context.Context, v *Verdict, pool *pgxpool.Pool, t func(string) string, ops []Op, payments map[string]payment) error {
	rows, err := pool.Query(ctx, `SELECT key, state, coalesce(status_code, 0) FROM `+t("idempotency_keys")+` WHERE operation = $1`, apiOperation)
	if err != nil {
		return fmt.Errorf("read idempotency keys: %w", err)
	}
	type record struct {
		state  string
		status int
	}
	stored := map[string]record{}
	var key string
	var r record
	if _, err := pgx.ForEachRow(rows, []any{&key, &r.state, &r.status}, func() error { stored[key] = r; return nil }); err != nil {
		return fmt.Errorf("read idempotency keys: %w", err)
	}
	for _, op := range ops {
		id := oncekit.DeriveID(apiCaller, op.Key).String()
		if _, exists := payments[id]; !exists || op.Reuse || op.RekeyOf != "" {
			continue
		}
		if r, ok := stored[idempotency.StoredKey(op.Key)]; !ok || r.state != "completed" || r.status < 200 || r.status > 299 {
			v.MissingResponses++
			v.fail(InvResponseStored, "payment %s exists, its key %s holds %+v (found: %t); client's outcome %s after %d attempts", id, op.Key, r, ok, op.Outcome, op.Attempts)
		}
	}
	return nil
}

// checkLedger: one entry per payment; the relay published each account's
// events in outbox order ((txid, seq): the order in which the enqueueing
// transactions began writing) or, with the logical relay, in commit order
// (an account's payments commit in the order of their seq, which the
// account's row lock hands out); the ordered consumer applied them in
// stream order (of each event's first copy).
func checkLedger(ctx context.Context, v *Verdict, pool *pgxpool.Pool, t func(string) string, logical bool, payments map[string]payment, stream []StreamEvent, phantoms *phantomSet) error {
	var outboxPos map[string]int64
	var err error
	if logical {
		outboxPos = commitOrder(payments)
	} else if outboxPos, err = outboxOrder(ctx, pool, t); err != nil {
		return err
	}
	streamPos := map[string]int64{}
	lastOutbox := map[string]int64{}
	for _, e := range stream {
		if _, seen := streamPos[e.EventID]; seen {
			continue // a re-published copy: the first one sets the order
		}
		streamPos[e.EventID] = int64(len(streamPos) + 1)
		pos, ok := outboxPos[e.EventID]
		if !ok {
			continue
		}
		if pos <= lastOutbox[e.Key] {
			v.fail(InvPublishOrder, "%s: event #%d in outbox order published (stream seq %d) after #%d", e.Key, pos, e.Seq, lastOutbox[e.Key])
		}
		lastOutbox[e.Key] = max(lastOutbox[e.Key], pos)
	}
	// A published event missing from the stream was lost between the
	// relay's publish acknowledgement and the reader: the broker's layer.
	for id := range outboxPos {
		if _, ok := streamPos[id]; !ok {
			v.fail(InvInStream, "outbox event %s is not in the stream", id)
		}
	}

	rows, err := pool.Query(ctx, `SELECT payment_id::text, account, event_id::text, attempt, applied_by, applied_at FROM `+t("ledger_entries")+` ORDER BY id`)
	if err != nil {
		return fmt.Errorf("read ledger: %w", err)
	}
	entries := map[string]int{}
	lastStream := map[string]int64{}
	var id, account, event string
	var attempt, pid int
	var at time.Time
	_, err = pgx.ForEachRow(rows, []any{&id, &account, &event, &attempt, &pid, &at}, func() error {
		v.LedgerEntries++
		entries[id]++
		pos, ok := streamPos[event]
		if !ok {
			v.fail(InvOrder, "%s: event %s applied but not in the stream", account, event)
			return nil
		}
		if pos <= lastStream[account] {
			v.OrderViolations++
			v.fail(InvOrder, "%s: event at stream position %d applied after %d (outbox #%d), delivery attempt %d, by pid %d at %s",
				account, pos, lastStream[account], outboxPos[event], attempt, pid, at.Format("15:04:05.000"))
		}
		lastStream[account] = max(lastStream[account], pos)
		return nil
	})
	if err != nil {
		return fmt.Errorf("read ledger: %w", err)
	}
	for id, n := range entries {
		if _, ok := payments[id]; !ok {
			phantoms.effect(v, "ledger entry", id)
		}
		if n > 1 {
			v.DuplicateEffects += n - 1
			v.fail(InvLedgerOnce, "payment %s has %d ledger entries", id, n)
		}
	}
	missing := 0
	for id := range payments {
		if entries[id] == 0 {
			v.Lost++
			missing++
			// Say for the first few where the chain stopped: its event, and
			// whether the inbox claimed it (a claim without its ledger entry
			// would be the inbox's bug; no claim, a message not processed).
			where := ""
			if missing <= maxExamplesPerRule {
				var event string
				var claimed bool
				err := pool.QueryRow(ctx, `SELECT o.id::text, EXISTS (SELECT 1 FROM `+t("processed_messages")+` pm WHERE pm.message_id = o.id)
					FROM `+t("outbox")+` o WHERE convert_from(o.payload, 'UTF8')::jsonb->>'payment_id' = $1`, id).Scan(&event, &claimed)
				switch {
				case err != nil:
					where = fmt.Sprintf(" (its event: %v)", err)
				default:
					where = fmt.Sprintf(" (event %s, claimed by the inbox: %t)", event, claimed)
				}
			}
			if _, published := streamPos[oncekit.DeriveID(id, "PaymentCreated").String()]; published {
				// In the stream, not applied: the consumer's claim and
				// work were erased after it acknowledged the broker.
				v.LostEffects++
				v.fail(InvNoLostEffects, "payment %s is in the stream and has no ledger entry%s", id, where)
				continue
			}
			v.fail(InvLedgerOnce, "payment %s has no ledger entry%s", id, where)
		}
	}
	return nil
}

// phantomSet holds the payments the survivor does not hold that the chain
// acted on anyway.
type phantomSet struct {
	erasable bool
	ids      map[string]bool // published, by payment
	acted    map[string]bool // acted on, by payment
}

// checkPhantoms finds the events in the stream whose payment the survivor
// does not hold: published from a transaction that is gone. Each event's
// payment is found through the keys of the history (every request's
// payment ID derives from its key); hostile messages are none of them.
func checkPhantoms(v *Verdict, erasable bool, ops []Op, payments map[string]payment, stream []StreamEvent) *phantomSet {
	byEvent := map[string]string{}
	for _, op := range ops {
		id := oncekit.DeriveID(apiCaller, op.Key).String()
		byEvent[oncekit.DeriveID(id, "PaymentCreated").String()] = id
	}
	ps := &phantomSet{erasable: erasable, ids: map[string]bool{}, acted: map[string]bool{}}
	first := map[string]bool{}
	for _, e := range stream {
		id, ok := byEvent[e.EventID]
		if !ok || first[e.EventID] {
			continue
		}
		first[e.EventID] = true // the broker's first copy is the one consumers saw
		p, exists := payments[id]
		switch {
		case !exists:
			ps.ids[id] = true
			v.Phantoms++
			if !erasable {
				v.fail(InvNoPhantoms, "event %s (stream seq %d) published for payment %s, which does not exist", e.EventID, e.Seq, id)
			}
		case e.AccountSeq != 0 && e.AccountSeq != p.seq:
			// The payment exists, made again by a retry under its key,
			// but the stream's copy (the broker keeps the first one of an
			// event ID) came from a transaction that is gone: it carries
			// another sequence number.
			v.Phantoms++
			if !erasable {
				v.fail(InvNoPhantoms, "event %s (stream seq %d) of payment %s carries account seq %d, the payment %d: published from a transaction that is gone, the payment made again",
					e.EventID, e.Seq, id, e.AccountSeq, p.seq)
			}
		}
	}
	return ps
}

// effect counts an action on a payment the survivor does not hold: a
// failure, unless the database failed over asynchronously and the payment's
// event was published (the consumer and the provider acted on a phantom).
func (ps *phantomSet) effect(v *Verdict, what, id string) {
	if !ps.acted[id] {
		ps.acted[id] = true
		v.PhantomEffects++
	}
	if ps.erasable && ps.ids[id] {
		return
	}
	v.fail(InvNoPhantoms, "%s for unknown payment %s", what, id)
}

// commitOrder returns the position of every payment's event in its
// account's commit order: the payment's seq.
func commitOrder(payments map[string]payment) map[string]int64 {
	order := make(map[string]int64, len(payments))
	for id, p := range payments {
		order[oncekit.DeriveID(id, "PaymentCreated").String()] = p.seq
	}
	return order
}

// outboxOrder returns the position of every outbox event in its ordering
// key's outbox order, from 1.
func outboxOrder(ctx context.Context, pool *pgxpool.Pool, t func(string) string) (map[string]int64, error) {
	rows, err := pool.Query(ctx, `SELECT id::text, row_number() OVER (PARTITION BY ordering_key ORDER BY txid, seq) FROM `+t("outbox"))
	if err != nil {
		return nil, fmt.Errorf("read outbox order: %w", err)
	}
	order := map[string]int64{}
	var id string
	var pos int64
	_, err = pgx.ForEachRow(rows, []any{&id, &pos}, func() error {
		order[id] = pos
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read outbox order: %w", err)
	}
	return order, nil
}

// checkProvider: the provider acted once per (payment, kind), every call
// for it carried the same, derived key, and no attempt number came twice:
// the ledger commits each attempt before its call, so a call whose process
// died is followed by the next number. (A call whose answer the provider
// dropped may come twice: Go's HTTP client resends a request carrying an
// Idempotency-Key when a reused connection closes without an answer.)
func checkProvider(v *Verdict, calls []ProviderCall, payments map[string]payment, phantoms *phantomSet) {
	type effect struct{ payment, kind string }
	type attempt struct{ key, n string }
	executed := map[effect]int{}
	sent := map[attempt]int{}
	for _, c := range calls {
		if a := (attempt{c.Key, c.Attempt}); c.Outcome != "lost" {
			if sent[a]++; sent[a] == 2 {
				v.RepeatedAttempts++
				v.fail(InvCallRecorded, "%s of payment %s: attempt %s called twice, the second %s", c.Kind, c.PaymentID, c.Attempt, c.Outcome)
			}
		}
		e := effect{c.PaymentID, c.Kind}
		if c.Executed {
			v.Executions++
			executed[e]++
		}
		if want := oncekit.DeriveKey(c.PaymentID, c.Kind); c.Key != want {
			v.MismatchedKeys++
			v.fail(InvKeyStable, "%s of payment %s called with key %.12s…, derived key %.12s…", c.Kind, c.PaymentID, c.Key, want)
		}
		if _, ok := payments[c.PaymentID]; !ok {
			phantoms.effect(v, c.Kind+" called", c.PaymentID)
		}
	}
	for id := range payments {
		for _, kind := range []string{effectKindCapture, effectKindReceipt} {
			switch n := executed[effect{id, kind}]; {
			case n == 0:
				v.Lost++
				v.fail(InvEffectOnce, "%s of payment %s never executed", kind, id)
			case n > 1:
				v.DuplicateEffects += n - 1
				v.fail(InvEffectOnce, "%s of payment %s executed %d times", kind, id, n)
			}
		}
	}
}

// checkSettled: after the drain nothing is left half-way.
func checkSettled(ctx context.Context, v *Verdict, pool *pgxpool.Pool, ob *outbox.Outbox, t func(string) string) error {
	rows, err := pool.Query(ctx, `SELECT state, count(*) FROM `+t("side_effects")+` WHERE state <> 'confirmed' GROUP BY state`)
	if err != nil {
		return fmt.Errorf("read side effects by state: %w", err)
	}
	var state string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&state, &n}, func() error {
		v.fail(InvEffectsSettled, "%d effects %s", n, state)
		return nil
	})
	if err != nil {
		return fmt.Errorf("read side effects by state: %w", err)
	}
	backlog, err := ob.Backlog(ctx, pool)
	if err != nil {
		return err
	}
	var parked, inProgress, dead int
	if err := pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM `+t("outbox")+` WHERE parked_at IS NOT NULL),
		(SELECT count(*) FROM `+t("idempotency_keys")+` WHERE state = 'in_progress'),
		(SELECT count(*) FROM `+t("dead_letters")+` WHERE substring(payload FROM 1 FOR 8) <> '`+hostilePrefix+`'::bytea)`).Scan(&parked, &inProgress, &dead); err != nil {
		return fmt.Errorf("count parked messages, requests in progress and dead letters: %w", err)
	}
	if backlog.Pending > 0 || parked > 0 {
		v.fail(InvOutboxDrained, "%d unpublished, %d parked", backlog.Pending, parked)
	}
	if inProgress > 0 {
		v.fail(InvEdgeSettled, "%d requests in progress", inProgress)
	}
	if dead > 0 {
		v.fail(InvNoDeadLetters, "%d dead letters", dead)
	}
	return nil
}

// Progress is the share of the acknowledged payments the database holds
// that reached the ledger: a broken build that merely stopped working is
// caught by any checker, so the broken builds must show progress too. (An
// acknowledged payment the database lost is what a broken build is caught
// by, not a sign that the chain after it stopped.)
func (v *Verdict) Progress() float64 {
	if v.OK-v.ackedMissing <= 0 {
		return 0
	}
	return min(float64(v.LedgerEntries)/float64(v.OK-v.ackedMissing), 1)
}

// Summary is the verdict in one machine-readable line, without the run's
// fault counts (Run adds them).
func (v *Verdict) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "ops=%d ok=%d failed=%d unknown=%d reused=%d rekeyed=%d payments=%d ledger=%d provider_calls=%d executions=%d lost=%d duplicate_effects=%d mismatched_keys=%d order_violations=%d phantoms=%d phantom_effects=%d lost_effects=%d erased=%d missing_responses=%d repeated_attempts=%d hostile=%d hostile_unanswered=%d hostile_dead_lettered=%d garbage_error_pages=%d progress=%.3f",
		v.Ops, v.OK, v.Failed, v.Unknown, v.Reused, v.Rekeyed, v.Payments, v.LedgerEntries, v.ProviderCalls, v.Executions, v.Lost, v.DuplicateEffects, v.MismatchedKeys, v.OrderViolations, v.Phantoms, v.PhantomEffects, v.LostEffects, v.Erased, v.MissingResponses, v.RepeatedAttempts,
		v.HostileSent, v.HostileMaybe, v.HostileDeadLettered, v.GarbageErrorPages, v.Progress())
	if v.erasable != nil {
		n := 0
		for _, c := range v.Consequences {
			n += c
		}
		fmt.Fprintf(&b, " erasure_consequences=%d", n)
	}
	return b.String()
}

// checkHostile finds where each hostile message ended: every one the
// broker acknowledged in exactly one dead letter (at least one without an
// ID), every one sent without an answer in at most one, and no dead letter
// of a hostile message the run did not send.
func checkHostile(ctx context.Context, v *Verdict, pool *pgxpool.Pool, schema string, h *Hostile) error {
	if h == nil {
		return nil
	}
	rows, err := pool.Query(ctx, `SELECT convert_from(payload, 'UTF8'), count(*) FROM "`+schema+`".dead_letters
		WHERE substring(payload FROM 1 FOR 8) = '`+hostilePrefix+`'::bytea GROUP BY payload`)
	if err != nil {
		return fmt.Errorf("read hostile dead letters: %w", err)
	}
	seen := map[string]int{}
	var payload string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&payload, &n}, func() error { seen[payload] = n; return nil }); err != nil {
		return fmt.Errorf("read hostile dead letters: %w", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	v.HostileSent, v.HostileMaybe = len(h.acked), len(h.maybe)
	for payload, n := range seen {
		v.HostileDeadLettered += n
		switch {
		case !h.acked[payload] && !h.maybe[payload]:
			v.fail(InvHostileSettled, "a dead letter of a hostile message never sent: %q", payload)
		case n > 1 && !h.noID[payload]:
			v.fail(InvHostileSettled, "%q dead-lettered %d times", payload, n)
		}
	}
	for payload := range h.acked {
		if seen[payload] == 0 {
			v.fail(InvHostileSettled, "%q acknowledged by the broker and never dead-lettered", payload)
		}
	}
	return nil
}
