package outbox

// PartitionOf is partitionOf, for the external tests.
var PartitionOf = partitionOf
