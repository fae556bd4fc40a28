package webhook

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/oncekit/oncekit/internal/cfgerr"
	"github.com/oncekit/oncekit/internal/httpretry"
	"github.com/oncekit/oncekit/internal/redact"
	"github.com/oncekit/oncekit/internal/untrusted"
	"github.com/oncekit/oncekit/sideeffect"
)

// Header names sent with every request.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderID             = "webhook-id"
	HeaderTimestamp      = "webhook-timestamp"
	HeaderSignature      = "webhook-signature"
	HeaderKind           = "Oncekit-Effect-Kind"
	HeaderAttempt        = "Oncekit-Attempt"
)

// Config configures a webhook Provider.
type Config struct {
	// URL receives the POSTs. Required; http or https.
	URL string
	// Secret signs requests, written whsec_<base64 key> (a key of 24 to 64
	// bytes, as Standard Webhooks asks). Required, unless Unsigned is set.
	Secret string
	// Unsigned sends requests without a webhook-signature: the receiver
	// cannot tell them from anyone else's. Only for a receiver that
	// authenticates calls otherwise (Header's Authorization, mTLS).
	// Defaults to false.
	Unsigned bool
	// AllowHTTP allows an http:// URL to a host other than loopback: calls,
	// their payloads and their keys then cross the network in clear text.
	// Defaults to false (https, or http to 127.0.0.0/8, ::1 or localhost).
	AllowHTTP bool
	// Timeout bounds each request. Defaults to 10s.
	Timeout time.Duration
	// ContentType of the payload. Defaults to "application/json".
	ContentType string
	// Header holds extra request headers (e.g. Authorization).
	Header http.Header
	// Key is the receiver's idempotency-key convention: the header that
	// carries the key, its length limit and the characters it takes
	// (Stripe, PayPal, Twilio, Adyen, StandardWebhooks). Defaults to
	// DefaultKey: Idempotency-Key, no limit.
	// Every request carries the key as webhook-id too.
	Key KeyPreset
	// KeysIgnored declares that the receiver does NOT dedup on the key
	// (Key.Header / webhook-id). The dispatcher then never repeats a call
	// whose outcome is unknown (a timeout, a crash mid-call): the effect
	// becomes unknown for an operator instead. Defaults to false: receivers
	// following Standard Webhooks dedup on webhook-id.
	KeysIgnored bool
	// RefHeader names the response header holding the receiver's reference
	// for the effect. Defaults to "Webhook-Ref".
	RefHeader string
	// DuplicateHeader names the response header a receiver sets to "true"
	// on a replay of an already processed key. Defaults to
	// "Idempotent-Replayed".
	DuplicateHeader string
	// Client sends the requests; it must not follow redirects. Defaults to
	// a client with a keep-alive transport of up to MaxConns connections.
	Client *http.Client
	// MaxConns sizes the default client's connection pool; set it to the
	// dispatcher's Concurrency. Defaults to 64.
	MaxConns int
}

// MaxRefBytes caps the receiver's reference (Config.RefHeader) a call
// returns, and so what provider_ref stores of it.
const MaxRefBytes = 256

// Provider posts effects to one webhook endpoint. It implements
// sideeffect.Provider and sideeffect.KeyHonourer.
type Provider struct {
	cfg    Config
	url    *url.URL // Config.URL, parsed
	keyH   string   // the header carrying the key besides webhook-id, or ""
	key    []byte
	signer *signer
	client *http.Client
	// rt sends the requests when the provider built its own client: that
	// client follows no redirects and has no jar or timeout, so its
	// transport alone does the same work, without Client.Do's per-request
	// header copy kept for redirects.
	rt http.RoundTripper
}

// ErrInvalidConfig is wrapped by the error New returns for a bad Config; the
// error's text names the field.
var ErrInvalidConfig = errors.New("webhook: invalid config")

// New returns a Provider for the endpoint.
func New(cfg *Config) (*Provider, error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	u, _ := url.Parse(c.URL)     // validated
	keyH, _ := c.Key.keyHeader() // validated
	p := &Provider{cfg: c, client: c.Client, url: u, keyH: keyH}
	if c.Secret != "" {
		p.key, _ = ParseSecret(c.Secret) // validated
		p.signer = newSigner(p.key)
	}
	if p.client == nil {
		p.client = NewClient(c.MaxConns)
		p.rt = p.client.Transport
	}
	return p, nil
}

// withDefaults returns a copy of c (the zero Config if nil) with defaults set
// and Header copied in canonical form.
func (c *Config) withDefaults() Config {
	var out Config
	if c != nil {
		out = *c
	}
	out.Timeout = cmp.Or(out.Timeout, 10*time.Second)
	out.ContentType = cmp.Or(out.ContentType, "application/json")
	out.RefHeader = cmp.Or(out.RefHeader, "Webhook-Ref")
	out.DuplicateHeader = cmp.Or(out.DuplicateHeader, "Idempotent-Replayed")
	if out.MaxConns < 0 {
		out.MaxConns = 0 // a negative size means the default too
	}
	out.MaxConns = cmp.Or(out.MaxConns, 64)
	h := make(http.Header, len(out.Header))
	for k, vs := range out.Header {
		h[http.CanonicalHeaderKey(k)] = append([]string(nil), vs...)
	}
	out.Header = h
	out.Key = cmp.Or(out.Key, DefaultKey)
	return out
}

// validate returns an error naming the first bad field, wrapping
// ErrInvalidConfig.
func (c *Config) validate() error {
	bad := cfgerr.For(ErrInvalidConfig, "webhook: Config")
	if c.URL == "" {
		return bad("URL", "required")
	}
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		shown := "an unparsable URL"
		if u != nil {
			shown = strconv.Quote(redact.URL(u))
		}
		return bad("URL", "want an http(s) URL, got %s", shown)
	}
	if u.Scheme == "http" && !c.AllowHTTP && !loopback(u.Hostname()) {
		return bad("URL", "%q is http to a host that is not loopback: use https, or set AllowHTTP", redact.URL(u))
	}
	if c.Timeout < 0 {
		return bad("Timeout", "%s is negative", c.Timeout)
	}
	if _, err := c.Key.keyHeader(); err != nil {
		return err
	}
	switch {
	case c.Secret == "" && !c.Unsigned:
		return bad("Secret", "required: requests are signed (whsec_<base64 key>), unless Unsigned is set")
	case c.Secret != "" && c.Unsigned:
		return bad("Unsigned", "set together with Secret; choose one")
	case c.Secret != "":
		key, err := ParseSecret(c.Secret)
		if err != nil {
			return bad("Secret", "%w", err)
		}
		if len(key) < MinSecretBytes || len(key) > MaxSecretBytes {
			return bad("Secret", "a key of %d bytes; Standard Webhooks asks for %d to %d", len(key), MinSecretBytes, MaxSecretBytes)
		}
	}
	return nil
}

// The length of a signing key Config.Secret may hold, after Standard
// Webhooks.
const (
	MinSecretBytes = 24
	MaxSecretBytes = 64
)

// loopback reports whether host is this machine's: localhost or a loopback
// address.
func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// NewClient returns an HTTP client suited to webhook calls: keep-alive
// connections (up to maxConns idle per host) and no redirects.
func NewClient(maxConns int) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = maxConns
	t.MaxIdleConnsPerHost = maxConns
	return &http.Client{
		Transport:     t,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// CallBound returns Config.Timeout: a dispatcher whose CallTimeout is
// longer bounds its calls to this provider by it (sideeffect.Bounded), and
// Call then needs no timer of its own.
func (p *Provider) CallBound() time.Duration { return p.cfg.Timeout }

// HonoursKeys reports whether the receiver dedups on the key (not
// Config.KeysIgnored).
func (p *Provider) HonoursKeys() bool { return !p.cfg.KeysIgnored }

// StatusError is a non-2xx answer.
type StatusError struct {
	Code int
	// Body is the start of the response body.
	Body string
}

// Error describes the answer.
func (e *StatusError) Error() string {
	if e.Body == "" {
		return fmt.Sprintf("webhook: HTTP %d", e.Code)
	}
	return fmt.Sprintf("webhook: HTTP %d: %s", e.Code, e.Body)
}

// Call posts the payload, signed, with the effect's key. See the package
// documentation for how answers are classified.
func (p *Provider) Call(ctx context.Context, c sideeffect.Call) (string, error) {
	key, err := p.cfg.Key.headerKey(c.Key)
	if err != nil {
		return "", sideeffect.Definite(err) // the receiver would refuse it: nothing is sent
	}
	now := time.Now()
	// A context of the caller's that ends sooner already bounds the call:
	// no second timer.
	if dl, ok := ctx.Deadline(); !ok || dl.After(now.Add(p.cfg.Timeout)) {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.Timeout)
		defer cancel()
	}
	// The URL was parsed once, in New: the request gets a copy of it rather
	// than parsing Config.URL again on every call.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "", bytes.NewReader(c.Payload))
	if err != nil {
		return "", sideeffect.Definite(fmt.Errorf("webhook: build request: %w", err))
	}
	u := *p.url
	req.URL, req.Host = &u, u.Host
	ts := strconv.FormatInt(now.Unix(), 10)
	// Canonical keys written directly (no per-call canonicalisation), the
	// values sharing one backing array.
	vals := [...]string{p.cfg.ContentType, key, c.Key, ts, "", c.Kind, strconv.Itoa(c.Attempt)}
	h := make(http.Header, len(p.cfg.Header)+len(vals)+len(c.Trace))
	for k, vs := range p.cfg.Header {
		h[k] = vs
	}
	vs := vals[:]
	h["Content-Type"] = vs[0:1:1]
	if p.keyH != "" {
		h[p.keyH] = vs[1:2:2] // as the provider writes it, not canonicalised
	}
	h[HeaderID] = vs[2:3:3]
	h[HeaderTimestamp] = vs[3:4:4]
	if p.signer != nil {
		vs[4] = p.signer.sign(c.Key, ts, c.Payload)
		h[HeaderSignature] = vs[4:5:5]
	}
	h[HeaderKind] = vs[5:6:6]
	h[HeaderAttempt] = vs[6:7:7]
	for k, v := range c.Trace {
		// The effect's trace context (traceparent, tracestate), unless a
		// header of the same name is configured.
		if k = textproto.CanonicalMIMEHeaderKey(k); h[k] == nil && validTraceHeader(k, v) {
			h[k] = []string{v}
		}
	}
	req.Header = h

	var resp *http.Response
	if p.rt != nil {
		resp, err = p.rt.RoundTrip(req)
	} else {
		resp, err = p.client.Do(req)
	}
	if err != nil {
		return "", fmt.Errorf("webhook: POST %s: %w", redact.URL(p.url), err) // indefinite
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if resp.ContentLength != 0 { // an empty body needs no draining
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)) // keep the connection reusable
		}
		_ = resp.Body.Close()
		// The receiver's reference is untrusted: made storable, within
		// MaxRefBytes.
		ref := untrusted.Text(resp.Header.Get(p.cfg.RefHeader), MaxRefBytes)
		if strings.EqualFold(resp.Header.Get(p.cfg.DuplicateHeader), "true") {
			return ref, sideeffect.ErrDuplicate
		}
		return ref, nil
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	_ = resp.Body.Close()
	serr := &StatusError{Code: resp.StatusCode, Body: snippet(body)}
	if Retryable(resp.StatusCode) {
		if d, ok := ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			return "", sideeffect.RetryAfter(serr, d)
		}
		return "", serr
	}
	return "", sideeffect.Definite(serr)
}

// Retryable reports whether a non-2xx status is indefinite: 408, 409, 425,
// 429 and every 5xx. Every other status is definite.
func Retryable(code int) bool { return httpretry.Retryable(code) }

// ParseRetryAfter reads a Retry-After value: delay seconds or an HTTP date
// (a date in the past means zero).
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) { return httpretry.After(v, now) }

// snippet is the start of an error body, for StatusError: made valid UTF-8
// and cut on a character boundary (a provider's error page is untrusted).
func snippet(b []byte) string {
	return untrusted.Text(strings.TrimSpace(string(b)), 200)
}

// IsTimeout reports whether err is a request timeout (an indefinite error).
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// validTraceHeader reports whether a trace header can be sent as is: a
// token for a name, no control character but tab in the value.
func validTraceHeader(k, v string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		if !validHeaderByte(k[i]) {
			return false
		}
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}
