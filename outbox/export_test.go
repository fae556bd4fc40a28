package outbox

import (
	"context"

	"github.com/jackc/pgx/v5/pgconn"
)

// PartitionOf is partitionOf, for the external tests.
var PartitionOf = partitionOf

// SkipMovedCheck turns the relay's check against a moved cluster off (true)
// or on, to show what the relay did without it.
func SkipMovedCheck(skip bool) { skipMovedCheck.Store(skip) }

// ConnectReplication is a LogicalRelay's connectReplication to
// connString (its ReplicationURL), for the external tests.
func ConnectReplication(ctx context.Context, connString string) (*pgconn.PgConn, error) {
	cfg, err := parseDirect(connString)
	if err != nil {
		return nil, err
	}
	return (&LogicalRelay{repl: cfg}).connectReplication(ctx)
}

// SweepSQL is the relay's sweep statement for schema, for the external
// tests.
func SweepSQL(schema string) string { return renderRelaySQL(schema).sweep }

// FetchSQL is the relay's batch statement for a partition that has held
// rows, for the external tests.
func FetchSQL(schema string) string { return renderRelaySQL(schema).fetch }

// ProbeSQL is the relay's probe for rows newly readable, for the external
// tests.
func ProbeSQL(schema string) string { return renderRelaySQL(schema).probe }

// PartitionsBeyondSQL is the relay's look for rows in partitions beyond its
// count, for the external tests.
func PartitionsBeyondSQL(schema string) string { return renderRelaySQL(schema).partitionsBeyond }

// NoBarrier turns a repartition's barrier in the relays off (true) or on,
// to show what the relays did without it.
func NoBarrier(off bool) { noBarrier.Store(off) }

// PartitionExpr is partitionExpr, for the external tests.
var PartitionExpr = partitionExpr

// PartitionHash is partitionHash, for the external tests.
var PartitionHash = partitionHash

// InsertSQL is Enqueue's INSERT for schema, for the external tests.
func InsertSQL(schema string) string { return renderOutboxSQL(schema).insert }
