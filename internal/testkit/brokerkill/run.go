package brokerkill

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/crashpoint"
	"github.com/oncekit/oncekit/internal/wait"
	"github.com/oncekit/oncekit/outbox"
)

// Config configures a run. Broker, Pool, URL, Schema and Command are
// required.
type Config struct {
	Broker Broker
	// Pool, URL and Schema are the run's database: oncekit's tables
	// migrated in Schema, which URL's search_path names.
	Pool   *pgxpool.Pool
	URL    string
	Schema string
	// Command returns the command of a helper process (the test binary
	// re-executed, running Helper); Run adds the run's environment to its
	// Env (nil: this process's) and sends its output to LogDir.
	Command func() *exec.Cmd
	// LogDir receives each helper's output, one file per process.
	LogDir string
	// Events over Keys keys; defaults 2,000 over 16.
	Events, Keys int
	// Relays and Consumers are the helper processes kept running; defaults
	// 2 and 2.
	Relays, Consumers int
	// Disruptions: SIGKILLs of relays and consumers, and consumers joining
	// and leaving, one each Every (randomised ±50%). Defaults 12 and 400 ms.
	Disruptions int
	Every       time.Duration
	// Timeout bounds the wait for every event to be applied once the
	// disruptions are over. Defaults to 90 s.
	Timeout time.Duration
	// Seed makes the schedule repeatable; 0 picks one.
	Seed uint64
}

func (c *Config) defaults() {
	c.Events = cmpOr(c.Events, 2000)
	c.Keys = cmpOr(c.Keys, 16)
	c.Relays = cmpOr(c.Relays, 2)
	c.Consumers = cmpOr(c.Consumers, 2)
	c.Disruptions = cmpOr(c.Disruptions, 12)
	c.Every = cmpOr(c.Every, 400*time.Millisecond)
	c.Timeout = cmpOr(c.Timeout, 90*time.Second)
	if c.Seed == 0 {
		c.Seed = rand.Uint64()
	}
}

func cmpOr[T int | time.Duration](v, d T) T {
	if v > 0 {
		return v
	}
	return d
}

// Run enqueues the events while it kills and restarts the helpers, waits
// until every event is applied, stops the helpers and counts. The error is
// about the run itself (a helper that cannot start, a timeout); the
// Summary's Failed says whether the history is right.
func Run(ctx context.Context, cfg Config) (Summary, error) {
	cfg.defaults()
	s := Summary{Broker: cfg.Broker.Name, Events: cfg.Events, Unordered: cfg.Broker.Unordered}
	start := time.Now()
	if _, err := cfg.Pool.Exec(ctx, `CREATE TABLE `+Effects+
		` (id bigserial PRIMARY KEY, event_id uuid NOT NULL, key text NOT NULL, seq int NOT NULL)`); err != nil {
		return s, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed>>1))
	f := &fleet{cfg: cfg, sum: &s}
	defer f.stop(syscall.SIGKILL)
	for range cfg.Relays {
		p, err := f.start("relay", "", 0)
		if err != nil {
			return s, err
		}
		f.relays = append(f.relays, p)
	}
	for range cfg.Consumers {
		p, err := f.start("consumer", "", 0)
		if err != nil {
			return s, err
		}
		f.consumers = append(f.consumers, p)
	}

	enqueued := make(chan error, 1)
	go func() { enqueued <- enqueue(ctx, cfg, time.Duration(cfg.Disruptions)*cfg.Every) }()

	// The disruptions, in a fixed rotation so that each kind happens: a
	// relay or a consumer SIGKILLed now, or restarted armed to SIGKILL
	// itself at its worst moment (a relay between publish and mark, a
	// consumer between commit and ack), a consumer joining the group and
	// leaving it gracefully: each join, leave and kill is a rebalance in
	// the middle of the other members' batches.
	kinds := []string{"kill-relay", "kill-consumer", "join", "crash-relay", "kill-consumer", "leave", "crash-consumer"}
	for i := range cfg.Disruptions {
		d := cfg.Every/2 + time.Duration(rng.Int64N(int64(cfg.Every)))
		if !wait.Sleep(ctx, d) {
			return s, ctx.Err()
		}
		if err := f.sweep(); err != nil {
			return s, err
		}
		var err error
		switch kinds[i%len(kinds)] {
		case "kill-relay":
			err = f.kill(f.relays, rng.IntN(len(f.relays)), "relay", "", 0)
		case "crash-relay":
			err = f.kill(f.relays, rng.IntN(len(f.relays)), "relay", relayCrash, 1+rng.IntN(3))
		case "kill-consumer":
			err = f.kill(f.consumers, rng.IntN(len(f.consumers)), "consumer", "", 0)
		case "crash-consumer":
			err = f.kill(f.consumers, rng.IntN(len(f.consumers)), "consumer", crashpoint.InboxAfterCommit, 1+rng.IntN(20))
		case "join":
			if f.extra == nil {
				f.extra, err = f.start("consumer", "", 0)
				s.Joins++
			}
		case "leave":
			if f.extra != nil {
				f.extra.signal(syscall.SIGTERM)
				f.extra = nil
				s.Leaves++
			}
		}
		if err != nil {
			return s, err
		}
	}
	if err := <-enqueued; err != nil {
		return s, err
	}

	ob, err := outbox.New(&outbox.Config{Schema: cfg.Schema})
	if err != nil {
		return s, err
	}
	drainFrom := time.Now()
	dctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	var helperErr error
	held := false // the broker still held messages at the last look
	err = wait.Until(dctx, 100*time.Millisecond, func(ctx context.Context) error {
		if helperErr = f.sweep(); helperErr != nil {
			return nil // stop waiting
		}
		lost, _, _, err := check(ctx, cfg.Pool, cfg.Events)
		if err != nil {
			return err
		}
		bl, err := ob.Backlog(ctx, cfg.Pool)
		if err != nil {
			return err
		}
		if lost > 0 || bl.Pending > 0 {
			return fmt.Errorf("%d events not applied, %d not published", lost, bl.Pending)
		}
		if idle := cfg.Broker.Idle; idle != nil {
			ok, err := idle(ctx)
			if held = !ok; err != nil || held {
				return errors.Join(errors.New("the broker still holds messages"), err)
			}
		}
		return nil
	})
	// A timeout with events lost is counted below; one with the broker
	// still holding copies is not, and fails the run here.
	if err = errors.Join(helperErr, err); err != nil && (held || !errors.Is(err, context.DeadlineExceeded)) {
		return s, err
	}
	s.Drain = time.Since(drainFrom)
	// Stop the helpers gracefully: what they had in hand is either applied
	// already or comes to no one (the run is over), and a duplicate
	// applied meanwhile is counted.
	f.stop(syscall.SIGTERM)
	s.Lost, s.Duplicates, s.OrderViolations, err = check(ctx, cfg.Pool, cfg.Events)
	s.Elapsed = time.Since(start)
	s.Stored = -1
	if err == nil && cfg.Broker.Stored != nil {
		s.Stored, err = cfg.Broker.Stored(ctx)
	}
	return s, err
}

// enqueue writes the events in small transactions spread over d: event i
// has key k(i mod Keys) and is the (i div Keys)-th of its key.
func enqueue(ctx context.Context, cfg Config, d time.Duration) error {
	ob, err := outbox.New(&outbox.Config{Schema: cfg.Schema})
	if err != nil {
		return err
	}
	const batch = 20
	rounds := (cfg.Events + batch - 1) / batch
	pause := d / time.Duration(rounds)
	for i := 0; i < cfg.Events; {
		tx, err := cfg.Pool.Begin(ctx)
		if err != nil {
			return err
		}
		var msgs []broker.Message
		for ; i < cfg.Events && len(msgs) < batch; i++ {
			msgs = append(msgs, broker.Message{ID: uuid.New(), Subject: cfg.Broker.Subject,
				Key: "k" + strconv.Itoa(i%cfg.Keys), Payload: []byte(strconv.Itoa(i / cfg.Keys))})
		}
		if _, err := ob.Enqueue(ctx, tx, msgs...); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		if !wait.Sleep(ctx, pause) {
			return ctx.Err()
		}
	}
	return nil
}
