package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/outbox"
)

// outboxRebase is `oncekit outbox rebase`: after the database was restored
// into another cluster or moved to one (the relay stops with "transaction
// IDs behind the relay's cursor"), it moves the outbox's rows and cursors
// into this cluster's transaction IDs (outbox.Outbox.Rebase). ob is set by
// the command's check.
func outboxRebase(e *env, ob **outbox.Outbox) subcommand {
	return subcommand{name: "rebase", check: noArguments, run: func(ctx context.Context, pool *pgxpool.Pool) error {
		res, err := (*ob).Rebase(ctx, pool)
		if err != nil {
			return err
		}
		if !res.Moved {
			fmt.Fprintln(e.stdout, "nothing to do: no partition's cursor and no row is ahead of this server's transaction IDs")
			return nil
		}
		fmt.Fprintf(e.stdout, "rebased the outbox onto this server's transaction IDs: %d partitions; "+
			"%d published rows kept published, %d held rows kept held, %d rows from before the move to publish, "+
			"%d rows written since the move after them; %d transaction IDs consumed to make room. "+
			"Every partition lease was ended: start the relays.\n",
			res.Partitions, res.Published, res.Held, res.Pending, res.New, res.BurnedXIDs)
		return nil
	}}
}
