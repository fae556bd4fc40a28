package webhook_test

import (
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/sideeffect"
	"github.com/oncekit/oncekit/sideeffect/webhook"
)

const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// The Standard Webhooks reference vector.
func TestSignMatchesStandardWebhooksVector(t *testing.T) {
	t.Parallel()
	key, err := webhook.ParseSecret(secret)
	require.NoError(t, err)
	got := webhook.Sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`))
	require.Equal(t, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", got)

	now := time.Unix(1614265330, 0)
	require.NoError(t, webhook.Verify(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", "v0,xx "+got, []byte(`{"test": 2432232314}`), time.Minute, now))
	require.ErrorIs(t, webhook.Verify(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", got, []byte(`{"test": 1}`), time.Minute, now), webhook.ErrBadSignature)
	require.ErrorIs(t, webhook.Verify(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", got, []byte(`{"test": 2432232314}`), time.Minute, now.Add(time.Hour)), webhook.ErrBadSignature)
	_, err = webhook.ParseSecret("whsec_not base64!")
	require.ErrorIs(t, err, webhook.ErrInvalidSecret)
}

func call(t *testing.T, p *webhook.Provider) (string, error) {
	t.Helper()
	return p.Call(context.Background(), sideeffect.Call{ID: 7, Key: "k-123", Kind: "order.paid", Payload: []byte(`{"a":1}`), Attempt: 2})
}

func TestRequestCarriesKeyAndSignature(t *testing.T) {
	t.Parallel()
	key, _ := webhook.ParseSecret(secret)
	var got http.Header
	var body []byte
	var target, host string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Clone()
		body, _ = io.ReadAll(r.Body)
		target, host = r.RequestURI, r.Host
		w.Header().Set("Webhook-Ref", "evt_1")
	}))
	defer srv.Close()
	p, err := webhook.New(&webhook.Config{URL: srv.URL + "/hooks/orders?tenant=a%20b", Secret: secret, Header: http.Header{"Authorization": {"Bearer t"}}})
	require.NoError(t, err)
	ref, err := call(t, p)
	require.NoError(t, err)
	require.Equal(t, "evt_1", ref)
	require.Equal(t, "/hooks/orders?tenant=a%20b", target)
	require.Equal(t, srv.Listener.Addr().String(), host)
	require.Equal(t, `{"a":1}`, string(body))
	require.Equal(t, "k-123", got.Get("Idempotency-Key"))
	require.Equal(t, "k-123", got.Get("webhook-id"))
	require.Equal(t, "order.paid", got.Get("Oncekit-Effect-Kind"))
	require.Equal(t, "2", got.Get("Oncekit-Attempt"))
	require.Equal(t, "Bearer t", got.Get("Authorization"))
	require.Equal(t, "application/json", got.Get("Content-Type"))
	require.NoError(t, webhook.Verify(key, got.Get("webhook-id"), got.Get("webhook-timestamp"), got.Get("webhook-signature"), body, time.Minute, time.Now()))
	require.True(t, p.HonoursKeys())
}

func TestStatusClassification(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code       int
		retryAfter string
		definite   bool
		ok         bool
		wait       time.Duration
	}{
		{code: 200, ok: true}, {code: 201, ok: true}, {code: 204, ok: true},
		{code: 301, definite: true}, {code: 400, definite: true}, {code: 401, definite: true}, {code: 404, definite: true},
		{code: 410, definite: true}, {code: 422, definite: true},
		{code: 408}, {code: 409}, {code: 425}, {code: 429, retryAfter: "7", wait: 7 * time.Second},
		{code: 500}, {code: 502}, {code: 503, retryAfter: "2", wait: 2 * time.Second}, {code: 504},
	} {
		t.Run(strconv.Itoa(tc.code), func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.retryAfter != "" {
					w.Header().Set("Retry-After", tc.retryAfter)
				}
				if tc.code == 301 {
					w.Header().Set("Location", "/elsewhere")
				}
				w.WriteHeader(tc.code)
				_, _ = w.Write([]byte("answer"))
			}))
			defer srv.Close()
			p, err := webhook.New(&webhook.Config{Unsigned: true, URL: srv.URL})
			require.NoError(t, err)
			_, err = call(t, p)
			if tc.ok {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			require.Equal(t, tc.definite, sideeffect.IsDefinite(err), "%v", err)
			var se *webhook.StatusError
			require.ErrorAs(t, err, &se)
			require.Equal(t, tc.code, se.Code)
			d, ok := sideeffect.RetryAfterOf(err)
			require.Equal(t, tc.wait > 0, ok)
			require.Equal(t, tc.wait, d)
		})
	}
}

func TestDuplicateReport(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Idempotent-Replayed", "true")
		w.Header().Set("Webhook-Ref", "evt_first")
	}))
	defer srv.Close()
	p, err := webhook.New(&webhook.Config{Unsigned: true, URL: srv.URL})
	require.NoError(t, err)
	ref, err := call(t, p)
	require.ErrorIs(t, err, sideeffect.ErrDuplicate)
	require.False(t, sideeffect.IsDefinite(err))
	require.Equal(t, "evt_first", ref)
}

func TestTransportErrorsAreIndefinite(t *testing.T) {
	t.Parallel()
	block := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-block:
		}
	}))
	defer slow.Close()
	defer close(block)
	p, err := webhook.New(&webhook.Config{Unsigned: true, URL: slow.URL, Timeout: 50 * time.Millisecond})
	require.NoError(t, err)
	_, err = call(t, p)
	require.Error(t, err)
	require.False(t, sideeffect.IsDefinite(err))
	require.True(t, webhook.IsTimeout(err), "%v", err)

	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	p, err = webhook.New(&webhook.Config{Unsigned: true, URL: gone.URL})
	require.NoError(t, err)
	_, err = call(t, p)
	require.Error(t, err)
	require.False(t, sideeffect.IsDefinite(err))
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, false}, {"0", 0, true}, {"120", 2 * time.Minute, true}, {" 3 ", 3 * time.Second, true},
		{"-1", 0, false}, {"soon", 0, false},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
	} {
		got, ok := webhook.ParseRetryAfter(tc.in, now)
		require.Equal(t, tc.ok, ok, tc.in)
		require.Equal(t, tc.want, got, tc.in)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	for _, c := range []*webhook.Config{nil, {}, {URL: "ftp://x"}, {URL: "http://"}, {URL: "https://x", Secret: "whsec_!!"}, {URL: "https://x", Timeout: -1}} {
		_, err := webhook.New(c)
		require.Error(t, err, "%+v", c)
	}
	p, err := webhook.New(&webhook.Config{Unsigned: true, URL: "https://example.com/hook", KeysIgnored: true})
	require.NoError(t, err)
	require.False(t, p.HonoursKeys())
}

func TestConfigErrorsNameTheFieldOnceAndHideCredentials(t *testing.T) {
	t.Parallel()
	_, err := webhook.New(&webhook.Config{URL: "https://x", Secret: "nope!"})
	require.ErrorIs(t, err, webhook.ErrInvalidSecret)
	require.Equal(t, 1, strings.Count(err.Error(), "webhook:"), err.Error())
	require.Contains(t, err.Error(), "Config.Secret")

	_, err = webhook.New(&webhook.Config{Unsigned: true, URL: "ftp://user:S3cret@host/x"})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "S3cret")

	p, err := webhook.New(&webhook.Config{Unsigned: true, URL: "http://user:S3cret@127.0.0.1:1/hook", Timeout: time.Second})
	require.NoError(t, err)
	_, err = p.Call(context.Background(), sideeffect.Call{ID: 1, Kind: "k", Key: "key"})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "S3cret")
}

func TestConfigValidateNamesTheField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		field string
		cfg   *webhook.Config
	}{
		{"URL", nil},
		{"URL", &webhook.Config{}},
		{"URL", &webhook.Config{Unsigned: true, URL: "ftp://host/x"}},
		{"Timeout", &webhook.Config{Unsigned: true, URL: "https://x", Timeout: -1}},
		{"Key.MaxLen", &webhook.Config{Unsigned: true, URL: "https://x", Key: webhook.KeyPreset{MaxLen: -1}}},
		{"Key.Header", &webhook.Config{Unsigned: true, URL: "https://x", Key: webhook.KeyPreset{Header: "bad header"}}},
		{"Secret", &webhook.Config{URL: "https://x", Secret: "nope!"}},
	} {
		_, err := webhook.New(tc.cfg)
		require.ErrorIs(t, err, webhook.ErrInvalidConfig, "%+v", tc.cfg)
		require.True(t, strings.HasPrefix(err.Error(), "webhook: Config."+tc.field+": "), "%v", err)
	}
	// A negative field reads as every Config's does.
	_, err := webhook.New(&webhook.Config{Unsigned: true, URL: "https://x", Timeout: -1})
	require.EqualError(t, err, "webhook: Config.Timeout: -1ns is negative")
}

// A provider is signed unless unsigned calls are chosen, its secret has the
// length Standard Webhooks asks for, http:// is for loopback unless allowed,
// and the stored reference is capped and made storable.
func TestProviderRefusesUnsafeConfigs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		field string
		cfg   webhook.Config
	}{
		{"Secret", webhook.Config{URL: "https://hooks.example.com/in"}},
		{"Unsigned", webhook.Config{URL: "https://hooks.example.com/in", Secret: secret, Unsigned: true}},
		{"Secret", webhook.Config{URL: "https://hooks.example.com/in", Secret: "whsec_" + base64.StdEncoding.EncodeToString(make([]byte, 16))}},
		{"Secret", webhook.Config{URL: "https://hooks.example.com/in", Secret: "whsec_" + base64.StdEncoding.EncodeToString(make([]byte, 65))}},
		{"URL", webhook.Config{URL: "http://hooks.example.com/in", Secret: secret}},
		{"URL", webhook.Config{URL: "http://10.0.0.1/in", Secret: secret}},
	} {
		_, err := webhook.New(&tc.cfg)
		require.ErrorIs(t, err, webhook.ErrInvalidConfig, "%+v", tc.cfg)
		require.ErrorContains(t, err, "Config."+tc.field)
	}
	for _, ok := range []webhook.Config{
		{URL: "http://127.0.0.1:1/in", Secret: secret},
		{URL: "http://localhost:1/in", Unsigned: true},
		{URL: "http://[::1]:1/in", Secret: secret},
		{URL: "http://hooks.example.com/in", Secret: secret, AllowHTTP: true},
		{URL: "https://hooks.example.com/in", Secret: "whsec_" + base64.StdEncoding.EncodeToString(make([]byte, 64))},
	} {
		_, err := webhook.New(&ok)
		require.NoError(t, err, "%+v", ok)
	}

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Webhook-Ref", strings.Repeat("r\xff", 1000))
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	p, err := webhook.New(&webhook.Config{URL: srv.URL, Secret: secret})
	require.NoError(t, err)
	ref, err := p.Call(context.Background(), sideeffect.Call{Key: "k", Payload: []byte(`{}`), Kind: "x", Attempt: 1})
	require.NoError(t, err)
	require.LessOrEqual(t, len(ref), webhook.MaxRefBytes)
	require.True(t, utf8.ValidString(ref))
}
