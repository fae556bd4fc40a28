package chaos

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/internal/wait"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/outbox/fleet"
)

// fleetMemberFlags configure one process of the fleet run: several
// fleet.Fleet members sharing one NATS connection, as `oncekit relay
// --fleet` runs one. They are the run's, not an operator's: the chaos run
// hosts its thirty members in a few processes so that one SIGKILL ends
// several members at once, as a host's crash would.
type fleetMemberFlags struct {
	nats, file, bucket, prefix, app string
	members, replicas               int
	ttl, lease, poll                time.Duration
}

func (f *fleetMemberFlags) args() []string {
	return []string{"-nats", f.nats, "-fleet", f.file, "-bucket", f.bucket, "-prefix", f.prefix, "-app", f.app,
		"-members", fmt.Sprint(f.members), "-replicas", fmt.Sprint(f.replicas),
		"-ttl", f.ttl.String(), "-lease", f.lease.String(), "-poll", f.poll.String()}
}

// FleetMemberMain runs the members of one fleet process of the chaos run
// (args as fleetMemberFlags.args gives them) until SIGTERM, and returns its
// exit status. Each member's ID is the process's prefix, its pid and its
// index, so that a restarted process joins with new members, as a
// restarted host would.
func FleetMemberMain(args []string) int {
	var f fleetMemberFlags
	fs := flag.NewFlagSet("fleet-member", flag.ContinueOnError)
	fs.StringVar(&f.nats, "nats", "", "NATS URLs, comma-separated")
	fs.StringVar(&f.file, "fleet", "", "the fleet's database file")
	fs.StringVar(&f.bucket, "bucket", "oncekit_fleet", "the members' bucket")
	fs.StringVar(&f.prefix, "prefix", "p", "member ID prefix")
	fs.StringVar(&f.app, "app", "oncekit-fleet", "application_name of the members' connections")
	fs.IntVar(&f.members, "members", 1, "members in this process")
	fs.IntVar(&f.replicas, "replicas", 3, "k")
	fs.DurationVar(&f.ttl, "ttl", 3*time.Second, "member TTL")
	fs.DurationVar(&f.lease, "lease", 3*time.Second, "partition lease")
	fs.DurationVar(&f.poll, "poll", 250*time.Millisecond, "relay poll interval")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := runFleetMembers(ctx, &f, log); err != nil {
		log.Error("fleet process failed", "err", err)
		return 1
	}
	return 0
}

func runFleetMembers(ctx context.Context, f *fleetMemberFlags, log *slog.Logger) error {
	dbs, err := fleet.ReadFile(f.file)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(f.nats, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.ReconnectJitter(50*time.Millisecond, 0), nats.RetryOnFailedConnect(true), nats.Timeout(2*time.Second),
		nats.ReconnectBufSize(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	pub, err := natsjs.NewPublisher(nc, &natsjs.PublisherConfig{AckTimeout: fleetPublishTimeout})
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	for i := range f.members {
		id := fmt.Sprintf("%s-%d-m%d", f.prefix, os.Getpid(), i)
		m, err := fleet.New(js, pub, &fleet.Config{
			ID: id, Group: f.prefix, Bucket: f.bucket, BucketReplicas: 3, Replicas: f.replicas, MemberTTL: f.ttl, ApplicationName: f.app,
			ConnectTimeout: 2 * time.Second, MinBackoff: 500 * time.Millisecond, MaxBackoff: 2 * time.Second,
			Relay:  outbox.RelayConfig{Lease: f.lease, PollInterval: f.poll, PublishTimeout: fleetPublishTimeout, StatsInterval: time.Minute},
			Logger: log,
		})
		if err == nil {
			err = m.Set(dbs)
		}
		if err != nil {
			return fmt.Errorf("member %s: %w", id, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Joining retries while NATS elects its leaders.
			for {
				err := m.Run(ctx)
				if err == nil || ctx.Err() != nil {
					return
				}
				log.Warn("fleet member could not join; again", "member", id, "err", err)
				if !wait.Sleep(ctx, 500*time.Millisecond) {
					return
				}
			}
		}()
	}
	fmt.Fprintf(os.Stderr, "fleet process %s up: %d members, pid %d, nats %s\n", f.prefix, f.members, os.Getpid(), strings.Split(f.nats, ",")[0])
	wg.Wait()
	return nil
}
