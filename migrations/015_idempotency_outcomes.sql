-- A request whose outcome the edge cannot prove (a provider's answer lost
-- mid-handler) is kept as 'unknown', with why, until a reconciliation or an
-- operator settles it; cleanup never deletes it. An operator's decision is
-- recorded on the record (who, why, when), as on side effects.
ALTER TABLE {schema}.idempotency_keys DROP CONSTRAINT idempotency_keys_state;
ALTER TABLE {schema}.idempotency_keys ADD CONSTRAINT idempotency_keys_state
	CHECK (state IN ('in_progress', 'completed', 'released', 'unknown'));
ALTER TABLE {schema}.idempotency_keys
	ADD COLUMN unknown_reason   text,
	ADD COLUMN resolved_by      text,
	ADD COLUMN resolution_note  text,
	ADD COLUMN resolved_at      timestamptz,
	-- The route's response version when the response was stored (Route.ResponseVersion).
	ADD COLUMN response_version integer NOT NULL DEFAULT 0;

-- Cleanup deletes expired completed and released records; unknown ones wait
-- for their decision.
DROP INDEX {schema}.idempotency_keys_expired;
CREATE INDEX idempotency_keys_expired ON {schema}.idempotency_keys (expires_at)
	WHERE state IN ('completed', 'released');

-- The records still waiting for an outcome, per operation, for the gauges
-- and the operators' list. A same-transaction claim (locked_until NULL) is
-- never visible in progress, and stays out of it: its hot path spares one
-- index entry.
CREATE INDEX idempotency_keys_unsettled ON {schema}.idempotency_keys (operation, created_at)
	WHERE state = 'unknown' OR (state = 'in_progress' AND locked_until IS NOT NULL);

-- Business keys (Route.BusinessKey): the client's own identity of an
-- operation (an account and a merchant reference, say), as a digest, with
-- the Idempotency-Key (its stored digest) that first used it. A new
-- Idempotency-Key with a known business key is answered from the first
-- operation instead of running again. A row outlives its key's record
-- (Route.BusinessKeyTTL); it goes when the key's request is released.
CREATE TABLE {schema}.idempotency_business_keys (
	tenant       text        NOT NULL,
	operation    text        NOT NULL,
	business_key text        NOT NULL,
	key          text        NOT NULL,
	fingerprint  bytea       NOT NULL,
	location     text,
	created_at   timestamptz NOT NULL DEFAULT now(),
	expires_at   timestamptz NOT NULL,
	PRIMARY KEY (tenant, operation, business_key)
);
CREATE INDEX idempotency_business_keys_key ON {schema}.idempotency_business_keys (tenant, operation, key);
CREATE INDEX idempotency_business_keys_expired ON {schema}.idempotency_business_keys (expires_at);
