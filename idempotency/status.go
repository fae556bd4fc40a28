package idempotency

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
)

// CodeKeyNotFound is the status resource's answer for a key without a record
// in the caller's scope.
const CodeKeyNotFound = "IDEMPOTENCY_KEY_NOT_FOUND"

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
	// (and Route.ReplayHeaders kept it): where the operation's resource is.
	Location string `json:"location,omitempty"`
}

// statusSQL reads a live record for the status resource.
const statusSQL = `
SELECT state, created_at, completed_at, expires_at, status_code, response_headers
FROM {schema}.idempotency_keys
WHERE tenant = $1 AND operation = $2 AND key = $3 AND ` + live

// StatusHandler returns the status resource of r's operation, for a client
// that lost an answer and would rather ask than retry: a GET with the key
// as the path value "key" (mount it at "GET /idempotency/{key}"), or in
// the Idempotency-Key header, answers the key's record in the caller's scope
// (r's Tenant, as the route's requests compute it) as a JSON Status; 404
// CodeKeyNotFound when there is none, which is also the answer for another
// scope's key. Mount it behind the same authentication as the route.
func (e *Edge) StatusHandler(r *Route) (http.Handler, error) {
	if r != nil && r.SharedScope && r.Tenant != nil {
		return nil, fmt.Errorf("%w: idempotency: Route.SharedScope: set together with Tenant; choose one", ErrInvalidConfig)
	}
	rc := r.withDefaults()
	if err := rc.validate(); err != nil {
		return nil, err
	}
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		raw := req.PathValue("key")
		if raw == "" {
			raw = req.Header.Get(HeaderKey)
		}
		key, err := ParseKey(raw)
		if err != nil {
			writeProblem(w, http.StatusBadRequest, CodeInvalidKey, err.Error(), 0)
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
		id := recordID{tenant: tenant, operation: rc.Operation, key: key}
		st := Status{Operation: rc.Operation}
		var status *int32
		var headers []byte
		err = e.db.QueryRow(req.Context(), e.sql.status, id.tenant, id.operation, id.stored()).
			Scan(&st.State, &st.CreatedAt, &st.CompletedAt, &st.ExpiresAt, &status, &headers)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			writeProblem(w, http.StatusNotFound, CodeKeyNotFound, "no record of this Idempotency-Key for this operation and caller", 0)
			return
		case err != nil:
			e.log.Error("idempotency: status lookup failed", "operation", id.operation, "key_hash", keyHash(id), "error", err)
			writeProblem(w, http.StatusServiceUnavailable, CodeStoreUnavailable, "the record could not be read; retry", 1)
			return
		}
		if status != nil {
			st.StatusCode = int(*status)
		}
		var h http.Header
		if len(headers) > 0 && json.Unmarshal(headers, &h) == nil {
			st.Location = h.Get("Location")
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(st)
	}), nil
}
