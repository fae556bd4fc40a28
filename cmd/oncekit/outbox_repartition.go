package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/outbox"
)

// outboxRepartition is `oncekit outbox repartition`: with --partitions N it
// changes the outbox's partition count online (outbox.Outbox.Repartition);
// without, it prints the partitioning and the phase of the last change. ob
// is set by the command's check.
func outboxRepartition(e *env, ob **outbox.Outbox, partitions *int) subcommand {
	return subcommand{name: "repartition", check: func(args []string) error {
		if err := noArguments(args); err != nil {
			return err
		}
		if *partitions < 0 || *partitions > outbox.MaxPartitions {
			return usagef("--partitions %d: want 1 to %d (0: show the partitioning)", *partitions, outbox.MaxPartitions)
		}
		return nil
	}, run: func(ctx context.Context, pool *pgxpool.Pool) error {
		if *partitions > 0 {
			if err := (*ob).Repartition(ctx, pool, *partitions); err != nil {
				return err
			}
		}
		st, err := (*ob).RepartitionState(ctx, pool)
		if err != nil {
			return err
		}
		if *partitions > 0 {
			fmt.Fprintf(e.stdout, "repartitioned the outbox from %d to %d partitions (epoch %d): "+
				"the relays publish what was written before the change first, then the rest\n", st.Previous, st.Partitions, st.Epoch)
			return nil
		}
		phase := "done"
		switch st.Phase {
		case outbox.PhaseDrain:
			phase = "draining: rows written before the change are being published; the rows after it wait"
		case outbox.PhaseHeld:
			phase = "held: parked or retrying rows written before the change hold their keys; other keys flow"
		}
		fmt.Fprintf(e.stdout, "partitions %d (epoch %d, previously %d, changed %s): %s\n",
			st.Partitions, st.Epoch, st.Previous, timestamp(st.ChangedAt), phase)
		return nil
	}}
}
