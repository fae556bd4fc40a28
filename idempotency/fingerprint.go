package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
	"mime"
	"strings"

	"github.com/oncekit/oncekit/idempotency/canonical"
)

// Fingerprint returns the SHA-256 fingerprint of a request: its method, the
// route's operation name, its path and query, and its body. A JSON body
// (Content-Type application/json or any +json type) is hashed in its RFC 8785
// canonical form, so member order, whitespace and number spelling do not
// change the fingerprint; any other body, and JSON that cannot be
// canonicalized, is hashed as raw bytes (tagged differently, so the two never
// collide). JSON holding a number that a double cannot represent exactly
// (an integer beyond 2^53, say a 64-bit ID) is hashed as raw bytes too: its
// canonical form would equate it with a different number.
func Fingerprint(method, operation, target, contentType string, body []byte) []byte {
	h := sha256.New()
	var n [8]byte
	write := func(b []byte) {
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	write([]byte("oncekit/idempotency/v1"))
	write([]byte(method))
	write([]byte(operation))
	write([]byte(target))
	if isJSON(contentType) {
		if canon, err := canonical.Exact(body); err == nil {
			write([]byte("json"))
			write(canon)
			return h.Sum(nil)
		}
	}
	write([]byte("raw"))
	write(body)
	return h.Sum(nil)
}

// isJSON reports whether a Content-Type names JSON.
func isJSON(contentType string) bool {
	if contentType == "" {
		return false
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}
