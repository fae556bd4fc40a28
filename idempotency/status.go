package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
)

// Status is the status resource's answer: what the record of a key says.
type Status struct {
	Operation   string     `json:"operation"`
	State       State      `json:"state"`
	CreatedAt   time.Time  `json:"created_at"`
	CompletedAt *time.Time `json:"completed_at,omitempty"`
	ExpiresAt   time.Time  `json:"expires_at"`
	// StatusCode is the stored response's, once completed.
	StatusCode int `json:"status_code,omitempty"`
	// Location is the stored response's Location header, when it had one
	// (and Route.Responses.ReplayHeaders kept it): where the operation's
	// resource is.
	Location string `json:"location,omitempty"`
	// Code is the problem code of the answer (a rejection's, stored or
	// released; see Route.Responses.Rejections), kept with the record after
	// its body expired and on a route that stores no body; "" for none.
	Code string `json:"code,omitempty"`
	// OperationID is the ID of the operation the key started (Info.ID),
	// "" for a record claimed before it was kept.
	OperationID string `json:"operation_id,omitempty"`
}

// statusSQL reads a live record for the status resource.
const statusSQL = `
SELECT state, created_at, completed_at, expires_at, status_code, response_headers,
	coalesce(problem_code, ''), coalesce(operation_id::text, '')
FROM {schema}.idempotency_keys
WHERE tenant = $1 AND operation = $2 AND key = $3 AND ` + live

// StatusHandler returns the status resource of the route built (by
// Route, the first one for it) for operation, for a client that lost an
// answer and would rather ask than retry: a GET addressed by the key's
// digest (StoredKey) as the path value "digest" (mount it at
// "GET "+Route.UnknownOutcomes.StatusPath, "GET /idempotency/create-payment/{digest}"
// say), or by the key itself in the Idempotency-Key header, answers the
// record in the caller's scope (the route's Tenant, or its SharedScope,
// as its requests compute it) as a JSON Status; 404 CodeKeyNotFound when
// there is none, which is also the answer for another scope's record.
// The key never travels in the URL: a path value "key" (a mount with
// {key}) or a digest that is not 64 lower-case hex digits answers 400
// CodeInvalidHandle. Mount it behind the same authentication as the
// route. An operation no route was built for is refused with
// ErrInvalidConfig.
func (e *Edge) StatusHandler(operation string) (http.Handler, error) {
	e.mu.Lock()
	route := e.routes[operation]
	e.mu.Unlock()
	if route == nil {
		return nil, fmt.Errorf("%w: idempotency: StatusHandler: no route of operation %q; build it with Edge.Route first", ErrInvalidConfig, operation)
	}
	rc := *route
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		stored, ok := statusHandle(w, req)
		if !ok {
			return
		}
		tenant, err := rc.Tenant(req)
		if err == nil && tenant == "" && !rc.SharedScope {
			err = errNoScope
		}
		if err != nil {
			writeProblem(w, http.StatusForbidden, CodeScopeRejected, "", 0)
			return
		}
		st, found, err := e.readStatus(req.Context(), tenant, rc.Operation, stored)
		switch {
		case err != nil:
			e.log.Error("idempotency: status lookup failed", "operation", rc.Operation, "key_hash", digestHash(tenant, rc.Operation, stored), "error", err)
			writeProblem(w, http.StatusServiceUnavailable, CodeStoreUnavailable, "the record could not be read; retry", 1)
			return
		case !found:
			writeProblem(w, http.StatusNotFound, CodeKeyNotFound, "no record of this Idempotency-Key for this operation and caller", 0)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(st)
	}), nil
}

// statusHandle returns the digest of the key req asks about (its path
// value "digest", or the Idempotency-Key header's key digested), answering
// 400 and reporting false when there is none or it is malformed.
func statusHandle(w http.ResponseWriter, req *http.Request) (string, bool) {
	if req.PathValue("key") != "" {
		writeProblem(w, http.StatusBadRequest, CodeInvalidHandle,
			"the status resource is addressed by the key's digest ({digest}), never by the key", 0)
		return "", false
	}
	if d := req.PathValue("digest"); d != "" {
		if !validDigest(d) {
			writeProblem(w, http.StatusBadRequest, CodeInvalidHandle, "the record's handle must be the key's digest: 64 lower-case hex digits", 0)
			return "", false
		}
		return d, true
	}
	key, err := ParseKey(req.Header.Get(HeaderKey))
	if err != nil {
		writeProblem(w, http.StatusBadRequest, CodeInvalidKey, err.Error(), 0)
		return "", false
	}
	return StoredKey(key), true
}

// validDigest reports whether s has the form of a key's digest as
// StoredKey returns it: 64 lower-case hex digits.
func validDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// readStatus reads the live record of (tenant, operation, stored) as a
// Status; found is false when there is none.
func (e *Edge) readStatus(ctx context.Context, tenant, operation, stored string) (st Status, found bool, err error) {
	st = Status{Operation: operation}
	var status *int32
	var headers []byte
	err = e.db.QueryRow(ctx, e.sql.status, tenant, operation, stored).
		Scan(&st.State, &st.CreatedAt, &st.CompletedAt, &st.ExpiresAt, &status, &headers, &st.Code, &st.OperationID)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Status{}, false, nil
	case err != nil:
		return Status{}, false, err
	}
	if status != nil {
		st.StatusCode = int(*status)
	}
	var h http.Header
	if len(headers) > 0 && json.Unmarshal(headers, &h) == nil {
		st.Location = h.Get("Location")
	}
	return st, true, nil
}
