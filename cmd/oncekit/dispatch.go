package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/migrations"
	"github.com/oncekit/oncekit/sideeffect"
	"github.com/oncekit/oncekit/sideeffect/webhook"
)

// dispatchFile is the JSON configuration of `oncekit dispatch --config`.
type dispatchFile struct {
	Endpoints map[string]endpointFile `json:"endpoints"`
	// Dispatcher settings; flags given on the command line win.
	Concurrency   int      `json:"concurrency"`
	BatchSize     int      `json:"batch_size"`
	PollInterval  duration `json:"poll_interval"`
	Lease         duration `json:"lease"`
	CallTimeout   duration `json:"call_timeout"`
	Recover       duration `json:"recover_interval"`
	MinBackoff    duration `json:"min_backoff"`
	MaxBackoff    duration `json:"max_backoff"`
	MaxAttempts   int      `json:"max_attempts"`
	Retention     duration `json:"retention"`
	RetentionRate int      `json:"retention_rate"`
}

// endpointFile is one kind's webhook endpoint.
type endpointFile struct {
	URL         string            `json:"url"`
	Secret      string            `json:"secret"`
	Unsigned    bool              `json:"unsigned"`
	AllowHTTP   bool              `json:"allow_http"`
	Timeout     duration          `json:"timeout"`
	KeysIgnored bool              `json:"keys_ignored"`
	Headers     map[string]string `json:"headers"`
}

// duration reads "1.5s"-style strings from JSON.
type duration time.Duration

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string like \"10s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = duration(v)
	return nil
}

// endpointFlags collects repeated --endpoint kind=URL flags.
type endpointFlags map[string]string

func (e endpointFlags) String() string { return "" }
func (e endpointFlags) Set(v string) error {
	kind, u, ok := strings.Cut(v, "=")
	if !ok || kind == "" || u == "" {
		return fmt.Errorf("want kind=URL, got %q", v)
	}
	if _, dup := e[kind]; dup {
		return fmt.Errorf("kind %q given twice", kind)
	}
	e[kind] = u
	return nil
}

// dispatcherFlags names the flags of the DispatcherConfig fields.
var dispatcherFlags = configFlags{"Concurrency": "--concurrency", "BatchSize": "--batch", "MaxAttempts": "--max-attempts",
	"PollInterval": "--poll-interval", "Lease": "--lease", "RecoverInterval": "--recover-interval", "MinBackoff": "--min-backoff",
	"MaxBackoff": "--max-backoff", "CallTimeout": "call_timeout", "Retention": "--retention", "ID": "--id", "Schema": "--schema"}

func runDispatch(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "dispatch", "dispatch [--config file.json] [--endpoint kind=URL ...] [flags]")
	var db dbFlags
	db.register(fs, e)
	endpoints := endpointFlags{}
	fs.Var(endpoints, "endpoint", "`kind=URL`: POST effects of kind to URL (repeatable)")
	configPath := fs.String("config", "", "JSON file mapping kinds to endpoints (see README)")
	var secretFlag envString
	fs.Var(&secretFlag, "secret", "whsec_<base64> signing `SECRET` for --endpoint kinds (default: env ONCEKIT_WEBHOOK_SECRET)")
	timeout := fs.Duration("timeout", 10*time.Second, "request timeout for --endpoint kinds")
	unsigned := fs.Bool("unsigned", false, "send --endpoint calls without a signature (the receiver authenticates them otherwise); without it --secret is required")
	allowHTTP := fs.Bool("allow-http", false, "allow http:// --endpoint URLs to hosts other than loopback (clear text)")
	keysIgnored := fs.Bool("keys-ignored", false, "the --endpoint receivers do not dedup on the key: never repeat a call of unknown outcome")
	concurrency := fs.Int("concurrency", 32, "provider calls at once")
	batch := fs.Int("batch", 200, "rows claimed per statement")
	poll := fs.Duration("poll-interval", 200*time.Millisecond, "wait before looking again after finding nothing due")
	lease := fs.Duration("lease", 0, "lease of a fired row (default 2×call timeout + 10s)")
	recoverEvery := fs.Duration("recover-interval", 5*time.Second, "how often expired leases are looked for")
	minBackoff := fs.Duration("min-backoff", time.Second, "first retry delay after an indefinite error")
	maxBackoff := fs.Duration("max-backoff", 10*time.Minute, "longest retry delay")
	maxAttempts := fs.Int("max-attempts", 25, "attempts before an indefinite error leaves the effect unknown")
	keepFor := fs.Duration("retention", 30*24*time.Hour, "keep confirmed/failed effects this long (negative: forever)")
	retentionRate := fs.Int("retention-rate", oncekit.DefaultRetentionRate, "most rows retention deletes per second (negative: no limit)")
	listen := fs.String("listen", "127.0.0.1:9465", "address of /healthz and /metrics (empty: off)")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	id := fs.String("id", "", "dispatcher ID, unique among running dispatchers (default host-pid-random)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if err := nonNegative(fs, "timeout", "poll-interval", "lease", "recover-interval", "min-backoff", "max-backoff"); err != nil {
		return err
	}
	secret := secretFlag.resolve(e, "ONCEKIT_WEBHOOK_SECRET", "")
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	var file dispatchFile
	if *configPath != "" {
		raw, err := os.ReadFile(*configPath)
		if err != nil {
			return usagef("--config: %v", err)
		}
		dec := json.NewDecoder(strings.NewReader(string(raw)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&file); err != nil {
			return usagef("--config %s: %v", *configPath, err)
		}
	}
	cfgs := map[string]*webhook.Config{}
	for kind, ep := range file.Endpoints {
		h := http.Header{}
		for k, v := range ep.Headers {
			h.Set(k, v)
		}
		cfgs[kind] = &webhook.Config{URL: ep.URL, Secret: ep.Secret, Unsigned: ep.Unsigned, AllowHTTP: ep.AllowHTTP,
			Timeout: time.Duration(ep.Timeout), KeysIgnored: ep.KeysIgnored, Header: h}
	}
	for kind, u := range endpoints {
		if _, dup := cfgs[kind]; dup {
			return usagef("--endpoint %s: kind also configured in --config", kind)
		}
		cfgs[kind] = &webhook.Config{URL: u, Secret: secret, Unsigned: *unsigned, AllowHTTP: *allowHTTP,
			Timeout: *timeout, KeysIgnored: *keysIgnored}
	}
	if len(cfgs) == 0 {
		return usagef("no endpoints: give --endpoint kind=URL or --config")
	}

	dc := &sideeffect.DispatcherConfig{
		ID:           *id,
		Concurrency:  pick(set["concurrency"], *concurrency, file.Concurrency),
		BatchSize:    pick(set["batch"], *batch, file.BatchSize),
		MaxAttempts:  pick(set["max-attempts"], *maxAttempts, file.MaxAttempts),
		PollInterval: pickD(set["poll-interval"], *poll, file.PollInterval), RecoverInterval: pickD(set["recover-interval"], *recoverEvery, file.Recover),
		MinBackoff: pickD(set["min-backoff"], *minBackoff, file.MinBackoff), MaxBackoff: pickD(set["max-backoff"], *maxBackoff, file.MaxBackoff),
		Retention: pickD(set["retention"], *keepFor, file.Retention), Lease: pickD(set["lease"], *lease, file.Lease),
		RetentionRate: pick(set["retention-rate"], *retentionRate, file.RetentionRate),
		CallTimeout:   time.Duration(file.CallTimeout),
	}
	providers := map[string]sideeffect.Provider{}
	var kinds []string
	var longest time.Duration
	for kind, c := range cfgs {
		c.MaxConns = dc.Concurrency
		if c.Timeout == 0 {
			c.Timeout = 10 * time.Second
		}
		longest = max(longest, c.Timeout)
		p, err := webhook.New(c)
		if err != nil {
			return usagef("endpoint %s: %v", kind, err)
		}
		providers[kind] = p
		kinds = append(kinds, kind)
	}
	sort.Strings(kinds)
	if dc.CallTimeout == 0 {
		dc.CallTimeout = longest + time.Second // the request timeout fires first
	}

	log, err := newLogger(e, *logFormat, *logLevel)
	if err != nil {
		return err
	}
	log = log.With("cmd", "dispatch")
	reg := newRegistry()
	dc.Logger, dc.Registerer = log, reg

	pool, err := db.openFor(ctx, migrations.Dispatcher)
	if err != nil {
		return err
	}
	defer pool.Close()
	ledger, err := sideeffect.New(&sideeffect.Config{Schema: db.schema()})
	if err != nil {
		return dispatcherFlags.usage(err)
	}
	d, err := sideeffect.NewDispatcher(pool, ledger, providers, dc)
	if err != nil {
		return dispatcherFlags.usage(err)
	}
	if err := serveOps(ctx, log, *listen, reg, d.Healthy); err != nil {
		return err
	}
	log.Info("dispatching", "kinds", strings.Join(kinds, ","), "id", d.ID())
	if err := d.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// pick returns the flag's value when it was given, else the file's when
// set, else the flag's default.
func pick(flagSet bool, flagV, fileV int) int {
	if !flagSet && fileV != 0 {
		return fileV
	}
	return flagV
}

func pickD(flagSet bool, flagV time.Duration, fileV duration) time.Duration {
	if !flagSet && fileV != 0 {
		return time.Duration(fileV)
	}
	return flagV
}
