package idempotency

import (
	"encoding/json"
	"fmt"
	"mime"
	"strings"
)

// Rejection says what becomes of a rejection with a given problem code:
// an answer of status 400 or more that Route.Responses.Store would store,
// whose body names the code (Route.Responses.Rejections).
type Rejection int

const (
	// Binding stores the rejection and replays it to every retry under the
	// key, whatever changed since: the decision is the key's, as a
	// success's is. The default for every code a route does not list.
	Binding Rejection = iota
	// Released stores no response: the key is released, keeping its
	// request's fingerprint, so that a retry with the same key and
	// request runs again, and may succeed once the state the rejection
	// depended on changed (a balance topped up, stock back); another
	// request under the key is still refused as reused. In SameTx mode
	// the handler's writes are rolled back, as for any release.
	Released
)

// String returns "binding" or "released".
func (r Rejection) String() string {
	if r == Released {
		return "released"
	}
	return "binding"
}

// MaxProblemCodeLen is the longest problem code the edge reads from an
// answer (and keeps on its record), in bytes.
const MaxProblemCodeLen = 64

// validProblemCode reports whether code is a problem code the edge reads
// and keeps: 1 to MaxProblemCodeLen bytes of letters, digits and "_-.:".
func validProblemCode(code string) bool {
	if code == "" || len(code) > MaxProblemCodeLen {
		return false
	}
	for i := 0; i < len(code); i++ {
		c := code[i]
		switch {
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c >= '0' && c <= '9', strings.IndexByte("_-.:", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// problemCode returns the problem code of a handler's answer: see
// problemCodeOf.
func (r *recorder) problemCode() string {
	return problemCodeOf(r.code(), r.headers().Get("Content-Type"), r.body.Bytes())
}

// problemCodeOf returns the problem code of an answer of status 400 or
// more: the "code" member (or, without one, "errorCode") of its JSON body
// (application/problem+json, application/json or another +json type), ""
// when there is none or it is not a valid code (too long, or with anything
// but letters, digits and "_-.:"). A success's body is never read.
func problemCodeOf(status int, contentType string, body []byte) string {
	if status < 400 {
		return ""
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
		return ""
	}
	var p struct {
		Code      any `json:"code"`
		ErrorCode any `json:"errorCode"`
	}
	if json.Unmarshal(body, &p) != nil {
		return ""
	}
	c := p.Code
	if c == nil {
		c = p.ErrorCode
	}
	if s, ok := c.(string); ok && validProblemCode(s) {
		return s
	}
	return ""
}

// storableCode is rw's problem code as the record keeps it: NULL for none,
// and for a handler that panicked.
func storableCode(rw *recorder, panicked any) *string {
	if panicked != nil || rw == nil {
		return nil
	}
	if c := rw.problemCode(); c != "" {
		return &c
	}
	return nil
}

// releases reports whether the route releases rw's answer instead of
// storing it: Route.Responses.Store refuses its status, or its problem code
// is Released in Route.Responses.Rejections.
func (rt *route) releases(rw *recorder) bool {
	if !rt.cfg.Responses.Store(rw.code()) {
		return true
	}
	if len(rt.cfg.Responses.Rejections) == 0 || rw.code() < 400 {
		return false
	}
	return rt.cfg.Responses.Rejections[rw.problemCode()] == Released
}

// validateRejections checks Route.Responses.Rejections' codes and values.
func validateRejections(m map[string]Rejection) error {
	for code, r := range m {
		if !validProblemCode(code) {
			return fmt.Errorf("code %q: 1 to %d bytes of letters, digits and \"_-.:\"", code, MaxProblemCodeLen)
		}
		if r != Binding && r != Released {
			return fmt.Errorf("code %s: unknown Rejection %d", code, r)
		}
	}
	return nil
}
