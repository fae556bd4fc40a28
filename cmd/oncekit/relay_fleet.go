package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/outbox/fleet"
)

// fleetConfigFlags names the flags of the fleet.Config fields and of its
// relays' template.
var fleetConfigFlags = func() configFlags {
	m := configFlags{"Bucket": "--fleet-bucket", "BucketReplicas": "--fleet-bucket-replicas", "Replicas": "--fleet-replicas",
		"Group": "--fleet-group", "MaxConnsPerDatabase": "--fleet-max-conns", "MemberTTL": "--fleet-member-ttl"}
	for k, v := range relayFlags {
		m[k] = v
	}
	return m
}()

// fleetFlags are `oncekit relay`'s flags of a fleet member (--fleet FILE).
type fleetFlags struct {
	file     string
	bucket   string
	bucketR  int
	replicas int
	group    string
	maxConns int
	reload   time.Duration
	ttl      time.Duration
}

func (f *fleetFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.file, "fleet", "", "`FILE` listing the databases of a relay fleet (JSON: [{\"name\", \"url\", \"schema\"}]): serve those fleet.AssignSpread gives this member instead of --database-url's; the file is re-read every --fleet-reload")
	fs.StringVar(&f.bucket, "fleet-bucket", "oncekit_fleet", "JetStream key-value bucket of the fleet's members (--fleet)")
	fs.IntVar(&f.bucketR, "fleet-bucket-replicas", 1, "replicas of --fleet-bucket when created or updated: on a JetStream cluster, its size (--fleet)")
	fs.IntVar(&f.replicas, "fleet-replicas", 3, "members serving each database (--fleet)")
	fs.StringVar(&f.group, "fleet-group", "", "the host or zone this member shares with others: a database's --fleet-replicas members are taken from as many groups as there are (default: the member alone) (--fleet)")
	fs.IntVar(&f.maxConns, "fleet-max-conns", 5, "most connections this member opens to one database (--fleet)")
	fs.DurationVar(&f.reload, "fleet-reload", 5*time.Second, "period at which --fleet's file is re-read")
	fs.DurationVar(&f.ttl, "fleet-member-ttl", 15*time.Second, "a member's entry outlives its last refresh this long (--fleet)")
}

// check refuses flags that a fleet member does not take, or fleet flags
// without --fleet.
func (f *fleetFlags) check(fs *flag.FlagSet) error {
	if f.file == "" {
		for _, n := range []string{"fleet-bucket", "fleet-bucket-replicas", "fleet-replicas", "fleet-group", "fleet-max-conns", "fleet-reload", "fleet-member-ttl"} {
			if flagSet(fs, n) {
				return usagef("--%s needs --fleet", n)
			}
		}
		return nil
	}
	for _, n := range []string{"logical", "slot", "replication-url", "standby-url", "database-url", "schema"} {
		if flagSet(fs, n) {
			return usagef("--fleet serves the databases its file lists: --%s does not apply", n)
		}
	}
	if f.reload <= 0 {
		return usagef("--fleet-reload: %v is not positive", f.reload)
	}
	return nil
}

// run serves the databases of f.file assigned to this member until ctx
// ends, re-reading the file every f.reload.
func (f *fleetFlags) run(ctx context.Context, log *slog.Logger, reg *prometheus.Registry, listen string,
	nc *nats.Conn, pub broker.Publisher, relay outbox.RelayConfig) error {
	dbs, err := fleet.ReadFile(f.file)
	if err != nil {
		return usagef("--fleet: %v", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	member, err := fleet.New(js, pub, &fleet.Config{ID: relay.ID, Bucket: f.bucket, BucketReplicas: f.bucketR, Replicas: f.replicas,
		Group: f.group, MaxConnsPerDatabase: f.maxConns, MemberTTL: f.ttl, Relay: relay, Logger: log, Registerer: reg})
	if err != nil {
		return fleetConfigFlags.usage(err)
	}
	if err := member.Set(dbs); err != nil {
		return usagef("--fleet: %v", err)
	}
	healthy := func(context.Context) error {
		if !nc.IsConnected() {
			return errors.New("NATS disconnected")
		}
		return nil // a database down is its own gauge, not the member's health
	}
	if err := serveOps(ctx, log, listen, reg, healthy); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watched := make(chan struct{})
	go func() { defer close(watched); member.WatchFile(ctx, f.file, f.reload) }()
	err = member.Run(ctx)
	cancel()
	<-watched
	return err
}
