-- The outcomes of a batch request's items (idempotency.Item), kept under
-- the request's record: one row per item that ran to an outcome, written
-- in the item's own transaction with the item's writes, so that a retry of
-- the request after a failure halfway replays the items that ran and runs
-- the others. fingerprint is the request's, so that an item is replayed to
-- the same request only. The rows go when their request completes (its
-- answer then replays as a whole) and with their record (ON DELETE
-- CASCADE). Separate mode only: in SameTx mode a failed request's items
-- roll back with it, and nothing is kept.
CREATE TABLE {schema}.idempotency_items (
	tenant      text        NOT NULL,
	operation   text        NOT NULL,
	key         text        NOT NULL,
	item        text        NOT NULL,
	fingerprint bytea       NOT NULL,
	status      integer     NOT NULL,
	body        bytea       NOT NULL,
	body_sealed boolean     NOT NULL DEFAULT false,
	created_at  timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (tenant, operation, key, item),
	FOREIGN KEY (tenant, operation, key) REFERENCES {schema}.idempotency_keys ON DELETE CASCADE
);
