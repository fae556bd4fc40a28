-- The number of outbox partitions is stated once, here, as the rows of
-- relay_partitions (0 to N-1): writers (Enqueue) and relays read it, so
-- they cannot disagree. A new schema gets 16; a schema whose relays have
-- already created their rows keeps that count, and every partition the
-- outbox already uses has its row. To use another count, add or delete rows
-- while no writer or relay runs and the outbox holds nothing unpublished:
-- a key's partition follows the count.
INSERT INTO {schema}.relay_partitions (partition)
	SELECT generate_series(0, 15) WHERE NOT EXISTS (SELECT 1 FROM {schema}.relay_partitions);
INSERT INTO {schema}.relay_partitions (partition)
	SELECT generate_series(0, (SELECT max(partition) FROM {schema}.outbox)) ON CONFLICT DO NOTHING;
INSERT INTO {schema}.relay_partitions (partition)
	SELECT generate_series(0, (SELECT max(partition) FROM {schema}.relay_partitions)) ON CONFLICT DO NOTHING;
