-- The outbox: events written in the producer's own transaction, waiting for
-- the relay. txid orders rows by writing transaction so that a late commit is
-- never overtaken: the relay only reads rows whose txid is below the xmin of
-- its snapshot (every transaction that could still add an earlier row has
-- ended), in (txid, seq) order. A published row is moved to outbox_published
-- (a delete here is far cheaper than rewriting the row), so this table holds
-- only pending and parked rows and nothing is ever skipped by a cursor.
CREATE TABLE {schema}.outbox (
	seq             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	id              uuid        NOT NULL,
	txid            xid8        NOT NULL DEFAULT pg_current_xact_id(),
	partition       integer     NOT NULL,
	ordering_key    text        NOT NULL DEFAULT '',
	subject         text        NOT NULL,
	payload         bytea       NOT NULL,
	headers         jsonb,
	created_at      timestamptz NOT NULL DEFAULT now(),
	attempts        integer     NOT NULL DEFAULT 0,
	next_attempt_at timestamptz,
	last_error      text,
	parked_at       timestamptz,
	CONSTRAINT outbox_id_key UNIQUE (id)
);

-- What the relay reads: rows of one partition in commit order.
CREATE INDEX outbox_pending ON {schema}.outbox (partition, txid, seq);

-- Rows that block their key: waiting for a retry or parked. Small by nature.
CREATE INDEX outbox_blocked ON {schema}.outbox (partition, ordering_key, txid, seq)
	WHERE parked_at IS NOT NULL OR next_attempt_at IS NOT NULL;

-- Published messages, kept (without payload) for Retention: Enqueue treats
-- their IDs as duplicates, and operators can see what went out when. Keyed by
-- seq (appended in near order, cheap); IDs are looked up through a hash index,
-- which costs a fraction of a B-tree over random UUIDs on insert.
CREATE TABLE {schema}.outbox_published (
	seq          bigint PRIMARY KEY,
	id           uuid        NOT NULL,
	partition    integer     NOT NULL,
	ordering_key text        NOT NULL,
	subject      text        NOT NULL,
	created_at   timestamptz NOT NULL,
	attempts     integer     NOT NULL,
	published_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX outbox_published_id ON {schema}.outbox_published USING hash (id);

-- Rows arrive in published_at order, so a BRIN index serves retention at
-- almost no cost per insert.
CREATE INDEX outbox_published_at ON {schema}.outbox_published USING brin (published_at);

-- Partition leases: each partition is owned by at most one relay at a time.
-- token is the fencing token, bumped on every change of owner; the relay's
-- writes are conditioned on (owner, token).
CREATE TABLE {schema}.relay_partitions (
	partition  integer PRIMARY KEY,
	owner      text,
	token      bigint      NOT NULL DEFAULT 0,
	expires_at timestamptz NOT NULL DEFAULT '-infinity'
);

-- Live relay processes, so that each takes a fair share of the partitions.
CREATE TABLE {schema}.relay_nodes (
	id           text PRIMARY KEY,
	heartbeat_at timestamptz NOT NULL DEFAULT now()
);
