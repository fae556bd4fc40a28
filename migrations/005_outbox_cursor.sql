-- The relay keeps a cursor per partition instead of moving each published
-- row: every row up to (cursor_txid, cursor_seq) has been read, and because
-- the relay reads only below its snapshot's xmin, in (txid, seq) order, no
-- row at or before the cursor can ever appear later. A row is published when
-- it is at or before its partition's cursor and not held; held rows
-- (next_attempt_at or parked_at set, the partial index outbox_blocked) wait
-- for a retry, are parked, or follow a blocked row of their key. Published
-- rows stay in outbox (Enqueue's UNIQUE (id) reports a re-enqueued published
-- ID as a duplicate) until retention deletes them.
--
-- The default cursor, (2, 0), lies before every row a transaction writes
-- (PostgreSQL assigns transaction IDs from 3).
ALTER TABLE {schema}.relay_partitions
	ADD COLUMN cursor_txid xid8   NOT NULL DEFAULT '2',
	ADD COLUMN cursor_seq  bigint NOT NULL DEFAULT 0;

-- What was published before this migration becomes published rows of outbox
-- (txid 1: behind every cursor), so that Enqueue keeps reporting those IDs
-- as duplicates until retention deletes them. Their payload was not kept.
INSERT INTO {schema}.outbox (seq, id, txid, partition, ordering_key, subject, payload, created_at, attempts)
	OVERRIDING SYSTEM VALUE
	SELECT seq, id, '1', partition, ordering_key, subject, '', created_at, attempts
	FROM {schema}.outbox_published
	ON CONFLICT DO NOTHING;

-- Kept, empty, only so that writers of earlier releases (whose Enqueue looks
-- here) keep working until they are upgraded; nothing reads or writes it any
-- more. Relays of earlier releases must not run against this schema.
TRUNCATE {schema}.outbox_published;
