package idempotency

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Problem codes written in the "code" member of problem+json answers.
const (
	CodeMissingKey        = "MISSING_IDEMPOTENCY_KEY"
	CodeInvalidKey        = "INVALID_IDEMPOTENCY_KEY"
	CodeKeyReused         = "IDEMPOTENCY_KEY_REUSED"
	CodeInProgress        = "IDEMPOTENCY_REQUEST_IN_PROGRESS"
	CodeBodyTooLarge      = "REQUEST_BODY_TOO_LARGE"
	CodeBodyUnreadable    = "REQUEST_BODY_UNREADABLE"
	CodeScopeRejected     = "IDEMPOTENCY_SCOPE_REJECTED"
	CodeStoreUnavailable  = "IDEMPOTENCY_STORE_UNAVAILABLE"
	CodeKeyExpired        = "IDEMPOTENCY_KEY_EXPIRED"
	CodeBodyInvalid       = "REQUEST_BODY_INVALID"
	CodeBusinessKeyReused = "BUSINESS_KEY_REUSED"
	CodeResponseOutdated  = "IDEMPOTENCY_RESPONSE_OUTDATED"
	// CodeInvalidHandle answers a status resource addressed by anything
	// but a key's digest (StoredKey: 64 lower-case hex digits).
	CodeInvalidHandle = "IDEMPOTENCY_RECORD_HANDLE_INVALID"
)

// problem is an RFC 9457 problem details object with a stable code.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Instance is where to follow the matter up: the status resource of an
	// unknown outcome, the resource of a reused business key.
	Instance string `json:"instance,omitempty"`
	Code     string `json:"code"`
}

var problemTitles = map[string]string{
	CodeMissingKey:        "Idempotency-Key header is required",
	CodeInvalidKey:        "Idempotency-Key header is malformed",
	CodeKeyReused:         "Idempotency-Key was used for a different request",
	CodeInProgress:        "A request with this Idempotency-Key is in progress",
	CodeBodyTooLarge:      "Request body too large",
	CodeBodyUnreadable:    "Request body could not be read",
	CodeScopeRejected:     "Request scope could not be determined",
	CodeStoreUnavailable:  "Idempotency store unavailable",
	CodeKeyNotFound:       "No record of this Idempotency-Key",
	CodeKeyFlood:          "Too many new Idempotency-Keys",
	CodeKeyExpired:        "Idempotency-Key expired",
	CodeOutcomeUnknown:    "The outcome of the request is unknown",
	CodeBodyInvalid:       "Request body is invalid",
	CodeBusinessKeyReused: "The operation was already requested under another Idempotency-Key",
	CodeResponseOutdated:  "The stored response is no longer served",
	CodeInvalidHandle:     "The record's handle is malformed",
	CodeWrongRegion:       "The request belongs to another region",
	CodeRegionInvalid:     "The region header is malformed",
	CodeHomeUnknown:       "The home region of the request is unknown",
	CodeHomeUnreachable:   "The home region could not be reached",
}

// writeProblem answers with an application/problem+json body. retryAfter > 0
// adds a Retry-After header in whole seconds.
func writeProblem(w http.ResponseWriter, status int, code, detail string, retryAfterSec int) {
	writeProblemAt(w, status, code, detail, "", retryAfterSec)
}

// writeProblemAt is writeProblem with the problem's instance.
func writeProblemAt(w http.ResponseWriter, status int, code, detail, instance string, retryAfterSec int) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if retryAfterSec > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfterSec))
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(problem{
		Type:     "about:blank",
		Title:    problemTitles[code],
		Status:   status,
		Detail:   detail,
		Instance: instance,
		Code:     code,
	})
}
