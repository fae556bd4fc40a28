package idempotency

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
)

// recorder buffers a handler's response so that it reaches the client only
// after it is stored (and, in SameTx mode, committed with the handler's
// writes). Streaming, Flush and Hijack are not available behind the
// middleware.
type recorder struct {
	header http.Header
	sent   http.Header // header as of WriteHeader, as net/http would send it
	status int
	body   bytes.Buffer
}

func newRecorder() *recorder { return &recorder{header: http.Header{}} }

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
		r.sent = r.header.Clone()
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	return r.body.Write(p)
}

// headers returns the response header as the client gets it.
func (r *recorder) headers() http.Header {
	if r.sent == nil {
		return r.header
	}
	return r.sent
}

// code is the response status (200 if the handler wrote nothing).
func (r *recorder) code() int {
	if r.status == 0 {
		return http.StatusOK
	}
	return r.status
}

// sendTo writes the buffered response to w.
func (r *recorder) sendTo(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range r.headers() {
		h[k] = v
	}
	if h.Get("Content-Length") == "" && bodyAllowed(r.code()) {
		h.Set("Content-Length", strconv.Itoa(r.body.Len()))
	}
	w.WriteHeader(r.code())
	_, _ = w.Write(r.body.Bytes())
}

// replayHeaders returns the allow-listed response headers as stored JSON.
func (r *recorder) replayHeaders(allow []string) ([]byte, error) {
	kept := http.Header{}
	for _, name := range allow {
		if v, ok := r.headers()[name]; ok {
			kept[name] = v
		}
	}
	return json.Marshal(kept)
}

// replay answers w with a stored response.
func replay(w http.ResponseWriter, rec *record, body []byte) {
	h := w.Header()
	for k, v := range rec.headers {
		h[k] = v
	}
	h.Set(HeaderReplayed, "true")
	if bodyAllowed(rec.status) {
		h.Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(rec.status)
	_, _ = w.Write(body)
}

// bodyAllowed reports whether a response with this status may carry a body.
func bodyAllowed(status int) bool {
	return !(status >= 100 && status < 200) && status != http.StatusNoContent && status != http.StatusNotModified
}
