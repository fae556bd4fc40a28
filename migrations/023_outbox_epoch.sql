-- Online repartitioning (decision 037). The partition count writers use is
-- stated here, in the single row of outbox_epoch, with its epoch: a change
-- of count (outbox.Repartition) bumps the epoch. Enqueue computes each row's
-- partition in its INSERT from this row and stamps the row with the epoch;
-- the INSERT reads the table under an ACCESS SHARE lock, kept until the
-- writer commits, and Repartition changes it under ACCESS EXCLUSIVE, so the
-- change waits for the writers in flight and the writers after it see the
-- new count. phase says what the relays still wait for: 'drain', rows of
-- earlier epochs to publish (no row of the current epoch goes out before
-- they have); 'held', only held rows of earlier epochs are left, and only
-- their keys wait; NULL, nothing. relay_partitions keeps a row for every
-- partition in use: 0 to partitions-1, and while they still hold rows, the
-- partitions beyond a count that shrank.
CREATE TABLE {schema}.outbox_epoch (
	one        boolean     PRIMARY KEY DEFAULT true CHECK (one),
	epoch      integer     NOT NULL DEFAULT 0,
	partitions integer     NOT NULL CHECK (partitions BETWEEN 1 AND 1024), -- outbox.MaxPartitions
	previous   integer,
	phase      text        CHECK (phase IN ('drain', 'held')),
	-- Every row of an earlier epoch has a txid below this (the xmax of a
	-- snapshot the change took once its writers had ended): the relays'
	-- look for the rows left to drain reads no further.
	drain_below xid8,
	changed_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {schema}.outbox_epoch (partitions)
	SELECT coalesce(max(partition) + 1, 16) FROM {schema}.relay_partitions;

-- The epoch whose count gave the row its partition. Rows written before
-- this migration are of epoch 0. (A constant default: no table rewrite.)
ALTER TABLE {schema}.outbox ADD COLUMN epoch integer NOT NULL DEFAULT 0;

-- A writer in REPEATABLE READ or SERIALIZABLE reads outbox_epoch from its
-- transaction's snapshot, which may predate a repartition that committed
-- since: Enqueue's INSERT calls this function for those writers only, and
-- its share lock on the row fails with a serialization error (SQLSTATE
-- 40001, the transaction is retried) when the row changed after the
-- snapshot. SECURITY DEFINER: the lock needs UPDATE on the table, which
-- writers are not given.
CREATE FUNCTION {schema}.outbox_epoch_fresh() RETURNS boolean
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM 1 FROM {schema}.outbox_epoch FOR SHARE;
	RETURN true;
END
$$;
