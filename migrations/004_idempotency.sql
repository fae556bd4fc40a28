-- HTTP Idempotency-Key records. One row per (tenant, operation, key): the
-- atomic INSERT of this row is the claim. A row is in_progress while a request
-- owns it (in separate mode, under a lease renewed by the owner; in
-- same-transaction mode it is never visible uncommitted) and completed once the
-- response is stored. token is the fencing token, bumped on every recovery of
-- an in_progress row whose lease ran out, so a stale owner cannot store over
-- the new one.
CREATE TABLE {schema}.idempotency_keys (
	tenant           text        NOT NULL,
	operation        text        NOT NULL,
	key              text        NOT NULL,
	fingerprint      bytea       NOT NULL,
	state            text        NOT NULL DEFAULT 'in_progress'
	                 CONSTRAINT idempotency_keys_state CHECK (state IN ('in_progress', 'completed')),
	locked_until     timestamptz,
	token            bigint      NOT NULL DEFAULT 1,
	recoveries       integer     NOT NULL DEFAULT 0,
	status_code      integer,
	response_headers jsonb,
	response_body    bytea,
	body_sealed      boolean     NOT NULL DEFAULT false,
	created_at       timestamptz NOT NULL DEFAULT now(),
	completed_at     timestamptz,
	expires_at       timestamptz NOT NULL,
	PRIMARY KEY (tenant, operation, key),
	CONSTRAINT idempotency_keys_completed CHECK (state <> 'completed' OR status_code IS NOT NULL)
);

-- Cleanup deletes expired completed rows in batches, oldest first.
CREATE INDEX idempotency_keys_expired ON {schema}.idempotency_keys (expires_at) WHERE state = 'completed';

-- Drift and metrics look for in_progress rows past their lease. Same-transaction
-- claims (locked_until NULL, never visible uncommitted) stay out of it, which
-- spares their hot path one index write.
CREATE INDEX idempotency_keys_in_progress ON {schema}.idempotency_keys (locked_until)
	WHERE state = 'in_progress' AND locked_until IS NOT NULL;
