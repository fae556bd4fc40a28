package idempotency

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"
)

// MaxItemLen is the longest item ID of a batch request (Item), in bytes.
const MaxItemLen = 128

// MaxItemBodyBytes is the largest body an item's outcome may keep.
const MaxItemBodyBytes = 64 << 10

// ErrInvalidItem is wrapped by the errors ValidateItems and Item return
// for an item ID that is missing, too long, not UTF-8, holds a control
// character, or repeats another of the batch.
var ErrInvalidItem = errors.New("idempotency: invalid batch item")

// ItemError says which item of a batch is invalid and why; it wraps
// ErrInvalidItem. Its text never quotes the item ID.
type ItemError struct {
	Index  int // the item's index in the batch (-1: Item, which sees one item)
	Reason string
}

func (e *ItemError) Error() string {
	if e.Index < 0 {
		return "idempotency: batch item: " + e.Reason
	}
	return fmt.Sprintf("idempotency: batch item %d: %s", e.Index, e.Reason)
}

// Unwrap returns ErrInvalidItem.
func (e *ItemError) Unwrap() error { return ErrInvalidItem }

// itemProblem says what is wrong with an item ID, "" when nothing is.
func itemProblem(item string) string {
	switch {
	case item == "":
		return "the item ID is missing"
	case len(item) > MaxItemLen:
		return fmt.Sprintf("the item ID is over %d bytes", MaxItemLen)
	case !utf8.ValidString(item):
		return "the item ID is not UTF-8"
	}
	for _, c := range item {
		if unicode.IsControl(c) {
			return "the item ID holds a control character"
		}
	}
	return ""
}

// ValidateItems checks the item IDs of a batch request: each 1 to
// MaxItemLen bytes of UTF-8 without control characters, none repeated.
// Call it from Route.Command, so that a batch with a bad item answers 400
// REQUEST_BODY_INVALID before anything is stored. The error is an
// *ItemError.
func ValidateItems(items []string) error {
	seen := make(map[string]struct{}, len(items))
	for i, item := range items {
		if p := itemProblem(item); p != "" {
			return &ItemError{Index: i, Reason: p}
		}
		if _, dup := seen[item]; dup {
			return &ItemError{Index: i, Reason: "the item ID repeats an earlier item's"}
		}
		seen[item] = struct{}{}
	}
	return nil
}

// ItemOutcome is what one item of a batch request came to.
type ItemOutcome struct {
	// Status is the item's own status, as the batch's answer reports it
	// (201, 409, 422...): 100 to 599.
	Status int
	// Body is what the batch's answer says of the item (its resource's ID,
	// a problem), at most MaxItemBodyBytes. It is kept (sealed by the
	// edge's Sealer, if any) unless the route stores no body
	// (Route.Responses.NoStoreBody): a replayed item's Body is then nil.
	Body []byte
	// Replayed is set by Item when an earlier run of the request stored
	// the outcome: the item's function did not run again.
	Replayed bool
}

// ItemID returns oncekit.DeriveID(ID().String(), item): the deterministic
// ID of an item of a batch request, equal on every retry; one key becomes
// a family of IDs, one per item.
func (i Info) ItemID(item string) uuid.UUID { return oncekit.DeriveID(i.ID().String(), item) }

// Item runs one item of a batch request, named by item (the client's own
// ID of the item: a line number, a reference), at most once to an outcome
// under the request's key. In Separate mode, fn runs in a transaction of
// its own, which also stores its outcome under the request's record: fn's
// writes and the outcome commit together, and a retry of the request
// (after a failure halfway, a 5xx, a crash) gets the stored outcome, with
// Replayed set, without running fn, while the items that had not run, run.
// An error from fn rolls the item back and is returned as it is; nothing
// is stored for it. The outcomes go when the request's response is stored
// (it then replays as a whole), and are never replayed to another request
// under the key (one sent after the first's record expired). In SameTx mode
// fn runs in a savepoint of the request's transaction (Tx) and nothing is
// kept per item: a request that fails rolls back every item with it, and
// its retry runs them all, once. Item returns an *ItemError for an invalid
// item ID, ErrNotInRoute outside an idempotent route, and
// ErrOwnershipLost when the request's claim was taken over.
func Item(r *http.Request, item string, fn func(ctx context.Context, tx pgx.Tx) (ItemOutcome, error)) (ItemOutcome, error) {
	ctx := r.Context()
	if p := itemProblem(item); p != "" {
		return ItemOutcome{}, &ItemError{Index: -1, Reason: p}
	}
	if tx, ok := Tx(r); ok {
		return itemInTx(ctx, tx, fn)
	}
	s, ok := ctx.Value(itemsKey{}).(*itemScope)
	if !ok {
		return ItemOutcome{}, ErrNotInRoute
	}
	return s.run(ctx, item, fn)
}

// checkOutcome bounds what fn returned.
func checkOutcome(o ItemOutcome) error {
	if o.Status < 100 || o.Status > 599 {
		return fmt.Errorf("idempotency: item outcome: status %d is not 100 to 599", o.Status)
	}
	if len(o.Body) > MaxItemBodyBytes {
		return fmt.Errorf("idempotency: item outcome: body of %d bytes is over %d", len(o.Body), MaxItemBodyBytes)
	}
	return nil
}

// itemInTx runs fn in a savepoint of a SameTx request's transaction.
func itemInTx(ctx context.Context, tx pgx.Tx, fn func(context.Context, pgx.Tx) (ItemOutcome, error)) (ItemOutcome, error) {
	var out ItemOutcome
	err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
		o, err := fn(ctx, sp)
		if err != nil {
			return err
		}
		out = o
		return checkOutcome(o)
	})
	if err != nil {
		return ItemOutcome{}, err
	}
	return out, nil
}

// itemScope is what Item needs of a Separate-mode request's claim.
type itemScope struct {
	rt    *route
	id    recordID
	token int64
	used  atomic.Bool // an item was run or looked up: completion removes the outcomes
}

type itemsKey struct{}

// itemAAD binds a sealed item body to its record and item.
func (s *itemScope) itemAAD(item string) []byte {
	b := s.id.aad()
	b = binary.BigEndian.AppendUint32(b, uint32(len(item)))
	return append(b, item...)
}

// run is Item in Separate mode.
func (s *itemScope) run(ctx context.Context, item string, fn func(context.Context, pgx.Tx) (ItemOutcome, error)) (ItemOutcome, error) {
	s.used.Store(true)
	e, id := s.rt.e, s.id
	var out ItemOutcome
	err := pgx.BeginFunc(ctx, e.db, func(tx pgx.Tx) error {
		var claimed bool
		err := tx.QueryRow(ctx, e.sql.itemClaim, id.tenant, id.operation, id.stored(), s.token, item).Scan(&claimed)
		if errors.Is(err, pgx.ErrNoRows) { // stored by an earlier run, or the claim was taken over
			var sealed bool
			err = tx.QueryRow(ctx, e.sql.itemLookup, id.tenant, id.operation, id.stored(), item).Scan(&out.Status, &out.Body, &sealed)
			if errors.Is(err, pgx.ErrNoRows) {
				return ErrOwnershipLost
			}
			if err == nil && sealed {
				if e.cfg.Sealer == nil {
					return errors.New("idempotency: item outcome is sealed and no Sealer is configured")
				}
				out.Body, err = e.cfg.Sealer.Open(out.Body, s.itemAAD(item))
			}
			if err == nil && s.rt.cfg.Responses.NoStoreBody {
				out.Body = nil
			}
			out.Replayed = true
			return err
		}
		if err != nil {
			return fmt.Errorf("idempotency: claim item: %w", err)
		}
		o, err := fn(ctx, tx)
		if err != nil {
			return err
		}
		if err := checkOutcome(o); err != nil {
			return err
		}
		body, sealed := []byte{}, false
		if !s.rt.cfg.Responses.NoStoreBody && len(o.Body) > 0 {
			body = o.Body
			if e.cfg.Sealer != nil {
				if body, err = e.cfg.Sealer.Seal(body, s.itemAAD(item)); err != nil {
					return fmt.Errorf("idempotency: seal item outcome: %w", err)
				}
				sealed = true
			}
		}
		if _, err := tx.Exec(ctx, e.sql.itemStore, id.tenant, id.operation, id.stored(), item, o.Status, body, sealed); err != nil {
			return fmt.Errorf("idempotency: store item outcome: %w", err)
		}
		out = o
		return nil
	})
	if err != nil {
		return ItemOutcome{}, err
	}
	return out, nil
}

// itemClaimSQL takes an item of the request whose claim ($4) is still the
// caller's, returning a row; no row when the item's outcome is stored for
// this request already, or the claim is no longer the caller's. An item
// stored for another request under the key (a released one) is taken
// afresh. A concurrent holder of the item (an owner being fenced out)
// makes it wait for that holder's outcome.
const itemClaimSQL = `
INSERT INTO {schema}.idempotency_items AS i (tenant, operation, key, item, fingerprint, status, body)
SELECT k.tenant, k.operation, k.key, $5, k.fingerprint, 0, ''
FROM {schema}.idempotency_keys k
WHERE k.tenant = $1 AND k.operation = $2 AND k.key = $3 AND k.token = $4 AND k.state = 'in_progress'
ON CONFLICT (tenant, operation, key, item) DO UPDATE SET
	fingerprint = EXCLUDED.fingerprint, status = 0, body = '', body_sealed = false, created_at = now()
WHERE i.fingerprint <> EXCLUDED.fingerprint
RETURNING true`

// itemLookupSQL reads an item's stored outcome, if it was stored for the
// request that holds the key.
const itemLookupSQL = `
SELECT i.status, i.body, i.body_sealed
FROM {schema}.idempotency_items i
JOIN {schema}.idempotency_keys k USING (tenant, operation, key)
WHERE i.tenant = $1 AND i.operation = $2 AND i.key = $3 AND i.item = $4 AND i.fingerprint = k.fingerprint AND i.status > 0`

// itemStoreSQL stores a claimed item's outcome.
const itemStoreSQL = `
UPDATE {schema}.idempotency_items SET status = $5, body = $6, body_sealed = $7
WHERE tenant = $1 AND operation = $2 AND key = $3 AND item = $4`

// completeItemsSQL is completeSQL for a request that ran items: its
// items' outcomes go with the completion, its answer replaying them all.
const completeItemsSQL = completeCTEs + `,
it AS (
	DELETE FROM {schema}.idempotency_items
	WHERE tenant = $1 AND operation = $2 AND key = $3 AND EXISTS (SELECT FROM u))
SELECT count(*) FROM u`
