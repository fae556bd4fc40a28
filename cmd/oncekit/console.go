package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/console"
	"github.com/oncekit/oncekit/migrations"
	"github.com/oncekit/oncekit/outbox/fleet"
)

const consoleUsage = `console [--listen ADDR] [--writes] [--prefix PATH] [--reveal] [--replay] [--fleet FILE] [flags]

Serves the operator console (docs/console.md) on 127.0.0.1:7070 unless
--listen says otherwise. Read-only unless --writes; with writes, operators
authenticate with HTTP basic credentials from ONCEKIT_CONSOLE_OPERATORS
("name:password,...") or, behind a reverse proxy that sets it, the header
--trusted-header names. With --fleet, a Fleet page shows each database of
a relay fleet's list (the file oncekit relay --fleet reads), read again at
each view.`

// defaultConsoleListen keeps the console on loopback unless told otherwise.
const defaultConsoleListen = "127.0.0.1:7070"

func runConsole(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "console", consoleUsage)
	var db dbFlags
	db.register(fs, e)
	var nf natsFlags
	nf.register(fs, e)
	var listenFlag envString
	fs.Var(&listenFlag, "listen", "`ADDR` to serve on (default: env ONCEKIT_CONSOLE_LISTEN, else "+defaultConsoleListen+")")
	writes := fs.Bool("writes", false, "enable the actions (unpark, replay, resolve, retry), for authenticated operators")
	prefix := fs.String("prefix", "", "the `PATH` the console is served under behind a reverse proxy, e.g. /ops/oncekit")
	reveal := fs.Bool("reveal", false, "let operators show payloads and stored responses on request (hidden otherwise)")
	trusted := fs.String("trusted-header", "", "a request `HEADER` in which a reverse proxy puts the authenticated operator's name")
	replay := fs.Bool("replay", false, "offer dead-letter replay, publishing to JetStream at --nats-url")
	slot := fs.String("slot", "", "`NAME` of the logical relay's replication slot, shown in logical mode (default oncekit_ and the schema)")
	derive := fs.String("derive", "", "comma-separated `NAMES` the services derive event IDs with (DeriveID(id, name)), for the chain")
	fleetFile := fs.String("fleet", "", "a relay fleet's list `FILE` (as oncekit relay --fleet reads it), shown on a Fleet page")
	fleetTimeout := fs.Duration("fleet-timeout", 5*time.Second, "how long the Fleet page waits for each database, connecting included")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected arguments: %v", fs.Args())
	}
	log, err := newLogger(e, *logFormat, *logLevel)
	if err != nil {
		return err
	}
	operators, err := parseOperators(e.getenv("ONCEKIT_CONSOLE_OPERATORS"))
	if err != nil {
		return err
	}
	cfg := console.Config{Schema: db.schema(), Slot: *slot, Prefix: *prefix, Writes: *writes, Operators: operators,
		TrustedHeader: *trusted, Reveal: *reveal, Logger: log}
	if *derive != "" {
		cfg.Derive = strings.Split(*derive, ",")
	}
	if *fleetFile != "" {
		// Read now, so that a file that is missing or does not parse is
		// refused at start, and again at each view of the page.
		if _, err := fleet.ReadFile(*fleetFile); err != nil {
			return usagef("--fleet: %v", err)
		}
		cfg.Fleet = func() ([]fleet.Database, error) { return fleet.ReadFile(*fleetFile) }
		cfg.FleetTimeout = *fleetTimeout
	} else if flagSet(fs, "fleet-timeout") {
		return usagef("--fleet-timeout needs --fleet")
	}
	component := migrations.Console
	if *writes {
		component = migrations.ConsoleWrite
	}
	pool, err := db.openFor(ctx, component)
	if err != nil {
		return err
	}
	defer pool.Close()
	if *replay {
		nc, err := nf.connect("oncekit console")
		if err != nil {
			return err
		}
		defer nc.Close()
		if cfg.Publisher, err = natsjs.NewPublisher(nc, nil); err != nil {
			return err
		}
	}
	con, err := console.New(pool, &cfg)
	if err != nil {
		return usagef("%v", err)
	}
	ln, err := net.Listen("tcp", listenFlag.resolve(e, "ONCEKIT_CONSOLE_LISTEN", defaultConsoleListen))
	if err != nil {
		return usagef("--listen: %v", err)
	}
	srv := opsServer(con, opsIdleTimeout)
	log.Info("console serving", "addr", ln.Addr().String(), "writes", *writes, "loopback", isLoopback(ln.Addr()))
	fmt.Fprintf(e.stdout, "console on http://%s%s/\n", ln.Addr(), *prefix)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
}

// parseOperators reads "name:password,..." (ONCEKIT_CONSOLE_OPERATORS).
// The error never repeats a password.
func parseOperators(v string) (map[string]string, error) {
	if v == "" {
		return nil, nil
	}
	out := map[string]string{}
	for i, pair := range strings.Split(v, ",") {
		name, pw, ok := strings.Cut(strings.TrimSpace(pair), ":")
		if !ok || name == "" || pw == "" {
			return nil, usagef("ONCEKIT_CONSOLE_OPERATORS: entry %d is not name:password", i+1)
		}
		out[name] = pw
	}
	return out, nil
}

// isLoopback reports whether addr is on a loopback interface.
func isLoopback(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}
