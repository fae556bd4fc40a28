package browsertests_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/console"
	"github.com/oncekit/oncekit/internal/testkit/consoletest"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

const operator, password = "ana", "correct horse battery"

// browserErrors collects what the page reported as wrong: console errors,
// uncaught exceptions, and log entries (CSP violations among them).
type browserErrors struct {
	mu   sync.Mutex
	list []string
}

func (b *browserErrors) add(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.list = append(b.list, s)
}

func (b *browserErrors) all() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.list...)
}

// chromium finds Debian's chromium.
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no chromium on PATH: apt-get install chromium (.ci/run does)")
	return ""
}

// An operator, in a real browser, finds a payment by its Idempotency-Key,
// reads its chain, replays its dead letter, resolves its unknown effect
// and finds both actions in the audit; no page logs an error or violates
// the Content-Security-Policy. With ONCEKIT_CONSOLE_SHOTS=DIR it saves a
// screenshot of each page there (docs/console.md's).
func TestConsoleInABrowser(t *testing.T) {
	ctx := context.Background()
	db := testenv.NewDB(t)
	seeded := consoletest.Seed(t, db)
	nc := testenv.NewNATS(t)
	_, err := natsjs.EnsureStream(ctx, nc.JS, natsjs.StreamConfig{Name: "PAYMENTS", Subjects: []string{"payments.>"}})
	require.NoError(t, err)
	pub, err := natsjs.NewPublisher(nc.Conn, nil)
	require.NoError(t, err)
	con, err := console.New(db.Pool, &console.Config{Schema: db.Schema, Writes: true, Reveal: true, Publisher: pub,
		Operators: map[string]string{operator: password}, Derive: []string{consoletest.EventName}})
	require.NoError(t, err)
	srv := httptest.NewServer(con)
	t.Cleanup(srv.Close)

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1280, 900))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	bctx, cancelTimeout := context.WithTimeout(bctx, 2*time.Minute)
	defer cancelTimeout()

	// Every console message, uncaught exception and browser log entry
	// (a CSP violation is one) of a warning or worse is a failure.
	var problems browserErrors
	messages := chromedp.Console(bctx)
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleWarning || m.IsException() {
				problems.add(fmt.Sprintf("%s (%s) %s", m, m.Source, m.URL))
			}
		}
	}()
	auth := base64.StdEncoding.EncodeToString([]byte(operator + ":" + password))
	_, err = chromedp.Call(bctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{
		Headers: network.Headers{"Authorization": "Basic " + auth}})
	require.NoError(t, err)

	shots := os.Getenv("ONCEKIT_CONSOLE_SHOTS")
	shoot := func(name string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
			if shots == "" {
				return nil
			}
			png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644)
		})
	}
	text := func(sel string, into *string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
			var err error
			*into, err = chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
			return err
		})
	}
	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }

	// The overview, refreshed in place by its script.
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(css(`main h1`)),
		chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
			_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](`Number(document.body.dataset.refreshed || 0) > 0`,
				chromedp.WithPollingTimeout(20*time.Second)))
			return err
		}),
		shoot("overview")))

	// The chain, from the Idempotency-Key.
	var edge, events, claims, dead, effects string
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Navigate(srv.URL+"/chain"),
		chromedp.SendKeys(css(`input[name=q]`), consoletest.Key),
		chromedp.SendKeys(css(`input[name=tenant]`), consoletest.Tenant),
		chromedp.SendKeys(css(`input[name=operation]`), consoletest.Operation),
		chromedp.Click(css(`form.search button`)),
		chromedp.WaitVisible(css(`#chain-edge`)),
		text(`#chain-edge`, &edge),
		text(`#chain-events`, &events),
		text(`#chain-claims`, &claims),
		text(`#chain-dead`, &dead),
		text(`#chain-effects`, &effects),
		shoot("chain")))
	require.Contains(t, edge, "completed")
	require.Contains(t, edge, "201")
	require.Contains(t, events, seeded.EventID.String())
	require.Contains(t, events, "published")
	require.Contains(t, claims, "ledger")
	require.Contains(t, dead, "waiting")
	require.Contains(t, effects, "unknown")

	for _, p := range []string{"outbox", "inbox", "edge", "drift?run=1"} {
		require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/"+p), chromedp.WaitVisible(css(`main h1`)),
			shoot(strings.TrimSuffix(p, "?run=1"))), p)
	}

	// Replay the dead letter: confirm, then back on the inbox with the
	// result.
	var flash string
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Navigate(srv.URL+"/inbox/dead/"+strconv.FormatInt(seeded.DeadLetterID, 10)),
		chromedp.WaitVisible(css(`#replay`)),
		shoot("dead-letter"),
		chromedp.Click(css(`#replay`)),
		chromedp.WaitVisible(css(`#confirm`)),
		shoot("confirm"),
		chromedp.Click(css(`#confirm`)),
		chromedp.WaitVisible(css(`p.flash`)),
		text(`p.flash`, &flash)))
	require.Contains(t, flash, "inbox.replay")

	// Resolve the unknown effect.
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Navigate(srv.URL+"/effects"),
		chromedp.WaitVisible(css(`#unknown-effects`)),
		shoot("effects"),
		chromedp.SendKeys(css(`#unknown-effects form[action$="/effects/resolve"] input[name=note]`), "the provider shows the capture"),
		chromedp.Click(css(`#unknown-effects form[action$="/effects/resolve"] button`)),
		chromedp.WaitVisible(css(`#confirm`)),
		chromedp.Click(css(`#confirm`)),
		chromedp.WaitVisible(css(`p.flash`)),
		text(`p.flash`, &flash)))
	require.Contains(t, flash, "effects.resolve")

	var audit string
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Navigate(srv.URL+"/audit"),
		text(`#audit`, &audit),
		shoot("audit")))
	require.Contains(t, audit, "inbox.replay")
	require.Contains(t, audit, "effects.resolve")
	require.Contains(t, audit, operator)
	require.Contains(t, audit, "the provider shows the capture")

	var state string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT state FROM side_effects WHERE id = $1`, seeded.EffectID).Scan(&state))
	require.Equal(t, "confirmed", state)
	cancelTimeout()
	<-collected
	require.Empty(t, problems.all(), "the pages logged errors or CSP violations")
}
