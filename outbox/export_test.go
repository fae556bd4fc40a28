package outbox

// PartitionOf is partitionOf, for the external tests.
var PartitionOf = partitionOf

// SkipMovedCheck turns the relay's check against a moved cluster off (true)
// or on, to show what the relay did without it.
func SkipMovedCheck(skip bool) { skipMovedCheck.Store(skip) }

// ConnectReplication is connectReplication, for the external tests.
var ConnectReplication = connectReplication

// SweepSQL is the relay's sweep statement for schema, for the external
// tests.
func SweepSQL(schema string) string { return renderRelaySQL(schema).sweep }
