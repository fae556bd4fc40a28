package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/sideeffect"
)

// runReplay is `payments consume -replay-from ...`: it runs a window of the
// stream through the ledger consumer's handler, applying again what an
// asynchronous failover of PostgreSQL erased after JetStream was acked, and
// prints the counts as one line. It reads the stream with a consumer of its
// own (the durable "ledger" is not touched), and may run while the ledger
// consumers run.
func runReplay(ctx context.Context, cfg *config, pool *pgxpool.Pool, js jetstream.JetStream, out io.Writer) error {
	wc := *cfg.Replay
	wc.Stream, wc.FilterSubjects = stream, []string{subject}
	w, err := natsjs.NewWindow(ctx, js, wc)
	if err != nil {
		return err
	}
	defer w.Close()
	ledger, err := sideeffect.New(&sideeffect.Config{Schema: cfg.Schema})
	if err != nil {
		return err
	}
	h := inbox.JSON(func(ctx context.Context, tx pgx.Tx, m *inbox.Message, ev PaymentCreated) error {
		return applyPayment(ctx, tx, ledger, cfg, m, ev)
	})
	st, err := inbox.ReplayWindow(ctx, pool, h, ledgerConfig(cfg, slog.Default()), w)
	fmt.Fprintln(out, st)
	return err
}

// windowFlags reads -replay-from and -replay-to into cfg.Replay (nil
// unless -replay-from is given).
type windowFlags struct {
	from, to string
}

func (f windowFlags) window(now time.Time) (*natsjs.WindowConfig, error) {
	if f.from == "" {
		if f.to != "" {
			return nil, fmt.Errorf("-replay-to needs -replay-from")
		}
		return nil, nil
	}
	w := &natsjs.WindowConfig{}
	var err error
	if w.FromSeq, w.FromTime, err = windowBound(f.from, now); err != nil {
		return nil, fmt.Errorf("-replay-from: %w", err)
	}
	if f.to != "" {
		if w.ToSeq, w.ToTime, err = windowBound(f.to, now); err != nil {
			return nil, fmt.Errorf("-replay-to: %w", err)
		}
	}
	return w, nil
}

// windowBound parses a window's bound: a stream sequence (1234), a time
// (RFC 3339), or a duration before now (15m).
func windowBound(s string, now time.Time) (uint64, time.Time, error) {
	s = strings.TrimSpace(s)
	if seq, err := strconv.ParseUint(s, 10, 64); err == nil {
		if seq == 0 {
			return 0, time.Time{}, fmt.Errorf("sequences start at 1")
		}
		return seq, time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return 0, t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return 0, now.Add(-d), nil
	}
	return 0, time.Time{}, fmt.Errorf("%q: want a stream sequence, an RFC 3339 time or a duration before now (15m)", s)
}
