package idempotency_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
)

// strictCommand is a Route.Command that refuses a body that is not valid
// UTF-8 JSON with a positive amount and a ref of at most 64 bytes.
func strictCommand(_ *http.Request, body []byte) ([]byte, error) {
	if !utf8.Valid(body) {
		return nil, errors.New("the body is not UTF-8")
	}
	var in struct {
		Amount int64  `json:"amount"`
		Ref    string `json:"ref"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return nil, err
	}
	if in.Amount <= 0 {
		return nil, errors.New("amount must be positive")
	}
	if len(in.Ref) > 64 {
		return nil, errors.New("ref is longer than 64 bytes")
	}
	return json.Marshal(in)
}

// A request refused for its syntax (the key header: missing, empty, too
// long, not ASCII, with control characters, repeated; or the body, by
// Route.Command or Route.BusinessKey) runs nothing and stores nothing, in
// either mode: no record, no business key, and the key is still free for
// the client's corrected request.
func TestRefusedSyntaxStoresNothing(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, idempotency.Route{Mode: mode, Command: strictCommand, BusinessKey: &idempotency.BusinessKey{Of: merchantReference}}, nil)
			for _, body := range []string{
				`{"amount":-1,"ref":"r1"}`,               // the command refuses its value
				`{"amount":100,"ref":"r1","extra":true}`, // an unknown field
				"{\"amount\":100,\"ref\":\"r\xff\"}",     // not UTF-8
				`{"amount":100,"ref":"r1"`,               // truncated
				"",                                       // missing
				`{"amount":100,"ref":"` + strings.Repeat("r", 70000) + `"}`, // a ref too long, the body within MaxBodyBytes
			} {
				resp := h.post(t, "acme", "pay-1", body)
				require.Equal(t, http.StatusBadRequest, resp.status, "%.40q: %s", body, resp.body)
				require.Equal(t, idempotency.CodeBodyInvalid, resp.problemCode(t), "%.40q", body)
			}
			for _, key := range []string{
				strings.Repeat("k", idempotency.MaxKeyLen+1), // too long
				`""`,        // empty
				"ключ",      // not ASCII
				"tab\there", // a control character
				`"a";p=1`,   // parameters
			} {
				resp := h.post(t, "acme", key, `{"amount":100,"ref":"r1"}`)
				require.Equal(t, http.StatusBadRequest, resp.status, "%q", key)
				require.Equal(t, idempotency.CodeInvalidKey, resp.problemCode(t), "%q", key)
			}
			for _, raw := range []string{
				"Idempotency-Key: \r\n",                                  // empty value
				"Idempotency-Key: k\xff\xfek\r\n",                        // not UTF-8
				"Idempotency-Key: \"k\x00k\"\r\n",                        // NUL
				"Idempotency-Key: \"ab\x01cd\"\r\n",                      // control character
				"Idempotency-Key: a\r\nIdempotency-Key: b\r\n",           // repeated
				"Idempotency-Key: " + strings.Repeat("k", 4096) + "\r\n", // long
			} {
				status, body := rawPost(t, h.srv.URL, raw)
				require.Equal(t, http.StatusBadRequest, status, "%.60q: %s", raw, body)
			}
			require.Equal(t, http.StatusBadRequest, h.post(t, "acme", "", `{"amount":100,"ref":"r1"}`).status, "missing key")

			require.Zero(t, h.runs.Load(), "a refused request ran the handler")
			require.Zero(t, count(t, h.db, records), "a refused request left a record")
			require.Zero(t, count(t, h.db, `SELECT count(*) FROM idempotency_business_keys`), "a refused request left a business key")

			ok := h.post(t, "acme", "pay-1", `{"amount":100,"ref":"r1"}`)
			require.Equal(t, http.StatusCreated, ok.status, ok.body)
			require.Empty(t, ok.header.Get(idempotency.HeaderReplayed))
			require.Equal(t, 1, count(t, h.db, records))
		})
	}
}
