package idempotency

import (
	"encoding/json"
	"net/http"
	"strconv"
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
