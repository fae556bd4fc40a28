package webhook_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/sideeffect"
	"github.com/oncekit/oncekit/sideeffect/webhook"
)

// rawServer answers 200 to every request and hands over each request's
// header lines exactly as they came over the wire (name casing included).
// The test's end closes the listener and every connection the client kept
// alive, and waits for their goroutines.
func rawServer(t *testing.T) (url string, requests <-chan []string, count *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	ch := make(chan []string, 16)
	count = &atomic.Int32{}
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			wg.Go(func() {
				defer conn.Close()
				r := textproto.NewReader(bufio.NewReader(conn))
				for {
					if _, err := r.ReadLine(); err != nil { // request line
						return
					}
					var lines []string
					length := 0
					for {
						l, err := r.ReadLine()
						if err != nil {
							return
						}
						if l == "" {
							break
						}
						lines = append(lines, l)
						if name, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(name, "Content-Length") {
							length, _ = strconv.Atoi(strings.TrimSpace(v))
						}
					}
					if _, err := io.CopyN(io.Discard, r.R, int64(length)); err != nil {
						return
					}
					count.Add(1)
					ch <- lines
					if _, err := io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"); err != nil {
						return
					}
				}
			})
		}
	})
	return "http://" + ln.Addr().String() + "/hook", ch, count
}

// Each preset sends the effect's key in its provider's header, spelled as
// the provider documents it, plus webhook-id; no other key header.
func TestKeyPresetsOnTheWire(t *testing.T) {
	t.Parallel()
	key := oncekit.DeriveKey("payment-1", "charge")
	for _, tc := range []struct {
		preset webhook.KeyPreset
		line   string // the key's header line, as sent; "" for webhook-id alone
	}{
		{webhook.KeyPreset{}, "Idempotency-Key: " + key},
		{webhook.DefaultKey, "Idempotency-Key: " + key},
		{webhook.Stripe, "Idempotency-Key: " + key},
		{webhook.PayPal, "PayPal-Request-Id: " + key},
		{webhook.Twilio, "I-Twilio-Idempotency-Token: " + key},
		{webhook.Adyen, "Idempotency-Key: " + key},
		{webhook.StandardWebhooks, ""},
	} {
		t.Run(tc.preset.Provider, func(t *testing.T) {
			t.Parallel()
			url, requests, _ := rawServer(t)
			p, err := webhook.New(&webhook.Config{Unsigned: true, URL: url, Key: tc.preset})
			require.NoError(t, err)
			_, err = p.Call(context.Background(), sideeffect.Call{ID: 1, Key: key, Kind: "charge", Payload: []byte(`{}`), Attempt: 1})
			require.NoError(t, err)
			lines := <-requests
			require.Contains(t, lines, "webhook-id: "+key, "every request carries webhook-id")
			var keyLines []string
			for _, l := range lines {
				if strings.Contains(l, key) {
					keyLines = append(keyLines, l)
				}
			}
			want := []string{"webhook-id: " + key}
			if tc.line != "" {
				want = append(want, tc.line)
			}
			require.ElementsMatch(t, want, keyLines, "the key travels in exactly these headers")
		})
	}
}

// A key past the provider's documented limit fails the call as definite,
// before any request; one at the limit goes through.
func TestKeyPresetLimits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		preset webhook.KeyPreset
		max    int
	}{
		{webhook.Stripe, 255},
		{webhook.PayPal, 108},
		{webhook.Adyen, 64},
	} {
		t.Run(tc.preset.Provider, func(t *testing.T) {
			t.Parallel()
			url, requests, count := rawServer(t)
			p, err := webhook.New(&webhook.Config{Unsigned: true, URL: url, Key: tc.preset})
			require.NoError(t, err)
			call := func(key string) error {
				_, err := p.Call(context.Background(), sideeffect.Call{ID: 1, Key: key, Kind: "charge", Payload: []byte(`{}`), Attempt: 1})
				return err
			}
			require.NoError(t, call(strings.Repeat("a", tc.max)))
			<-requests
			err = call(strings.Repeat("a", tc.max+1))
			require.ErrorIs(t, err, webhook.ErrKeyTooLong)
			var ke *webhook.KeyError
			require.ErrorAs(t, err, &ke)
			require.Equal(t, []any{tc.preset.Provider, tc.max + 1, tc.max, -1}, []any{ke.Provider, ke.Len, ke.MaxLen, ke.Offset})
			require.NotContains(t, err.Error(), strings.Repeat("a", 20), "the error does not quote the key")
			require.True(t, sideeffect.IsDefinite(err), "the provider would refuse it: no retry")
			require.EqualValues(t, 1, count.Load(), "nothing was sent for the long key")
			require.LessOrEqual(t, len(oncekit.DeriveKey("x")), tc.max, "oncekit's derived keys fit")
		})
	}
	_, err := webhook.New(&webhook.Config{Unsigned: true, URL: "http://127.0.0.1:1", Key: webhook.KeyPreset{Header: "Bad Header"}})
	require.Error(t, err)
}

// A key the receiver would refuse for its characters fails the call as
// definite with a *KeyError before any request: control characters and
// leading or trailing spaces everywhere, anything but visible ASCII for the
// named presets.
func TestKeyCharacters(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		preset webhook.KeyPreset
		key    string
		offset int // -1: sent
	}{
		{webhook.Stripe, "order-42/charge", -1},
		{webhook.Stripe, "order 42", 5},
		{webhook.Adyen, "zahlung-\u00fc", 8},
		{webhook.PayPal, "", 0},
		{webhook.StandardWebhooks, "msg\x7f", 3},
		{webhook.Twilio, "a\tb", 1},
		{webhook.DefaultKey, "order 42 charge", -1},
		{webhook.DefaultKey, "zahlung-\u00fc", -1},
		{webhook.DefaultKey, "k\r\nX-Injected: 1", 1},
		{webhook.DefaultKey, " k", 0},
		{webhook.DefaultKey, "k ", 1},
	} {
		url, requests, count := rawServer(t)
		p, err := webhook.New(&webhook.Config{Unsigned: true, URL: url, Key: tc.preset})
		require.NoError(t, err)
		_, err = p.Call(context.Background(), sideeffect.Call{ID: 1, Key: tc.key, Kind: "charge", Payload: []byte(`{}`), Attempt: 1})
		if tc.offset < 0 {
			require.NoError(t, err, "%s %q", tc.preset.Provider, tc.key)
			<-requests
			continue
		}
		require.ErrorIs(t, err, webhook.ErrKeyInvalid, "%s %q", tc.preset.Provider, tc.key)
		var ke *webhook.KeyError
		require.ErrorAs(t, err, &ke)
		require.Equal(t, tc.offset, ke.Offset, "%s %q", tc.preset.Provider, tc.key)
		require.True(t, sideeffect.IsDefinite(err))
		require.Zero(t, count.Load(), "%s %q: nothing was sent", tc.preset.Provider, tc.key)
	}
}

// With Shorten, a key past MaxLen goes in the header as a deterministic
// short form: the same on every attempt, different for different keys, of
// MaxLen visible ASCII characters; webhook-id keeps the whole key.
func TestKeyShortened(t *testing.T) {
	t.Parallel()
	preset := webhook.KeyPreset{Provider: "Acquirer", Header: "X-Request-Key", MaxLen: 32, Shorten: true, VisibleASCII: true}
	url, requests, _ := rawServer(t)
	p, err := webhook.New(&webhook.Config{Unsigned: true, URL: url, Key: preset})
	require.NoError(t, err)
	sent := func(key string) (header, id string) {
		t.Helper()
		_, err := p.Call(context.Background(), sideeffect.Call{ID: 1, Key: key, Kind: "charge", Payload: []byte(`{}`), Attempt: 1})
		require.NoError(t, err)
		for _, l := range <-requests {
			if v, ok := strings.CutPrefix(l, "X-Request-Key: "); ok {
				header = v
			}
			if v, ok := strings.CutPrefix(l, "webhook-id: "); ok {
				id = v
			}
		}
		return header, id
	}
	k1, k2 := oncekit.DeriveKey("payment-1", "charge"), oncekit.DeriveKey("payment-2", "charge")
	require.Len(t, k1, 64)
	h1, id1 := sent(k1)
	again, _ := sent(k1)
	h2, _ := sent(k2)
	require.Len(t, h1, 32)
	require.Equal(t, h1, again, "the same key on every attempt")
	require.NotEqual(t, h1, h2)
	require.Regexp(t, `^[A-Za-z0-9_-]{32}$`, h1)
	require.Equal(t, k1, id1, "webhook-id carries the whole key")
	short, _ := sent("order-42")
	require.Equal(t, "order-42", short, "a key within MaxLen goes as it is")

	_, err = webhook.New(&webhook.Config{Unsigned: true, URL: url, Key: webhook.KeyPreset{Header: "X-K", MaxLen: 16, Shorten: true}})
	require.ErrorIs(t, err, webhook.ErrInvalidConfig)
	require.ErrorContains(t, err, "Config.Key.Shorten")
}
