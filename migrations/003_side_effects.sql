-- The side-effect ledger: one row per effect a handler decided to cause
-- (an email, a webhook, a payment capture), recorded in the handler's own
-- transaction and fired by the dispatcher with a derived idempotency key.
--
-- States: pending -> fired -> confirmed, plus failed (the provider certainly
-- did not act; terminal) and unknown (the outcome cannot be proven; only an
-- operator moves it on). A fired row carries a lease: when it expires the
-- dispatcher that fired it is presumed dead and recovery takes over.
CREATE TABLE {schema}.side_effects (
	id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	source_id        text        NOT NULL,
	kind             text        NOT NULL,
	payload          bytea       NOT NULL DEFAULT '\x',
	idempotency_key  text        NOT NULL,
	state            text        NOT NULL DEFAULT 'pending',
	attempts         integer     NOT NULL DEFAULT 0,
	next_attempt_at  timestamptz NOT NULL DEFAULT now(),
	lease_owner      text,
	lease_expires_at timestamptz,
	provider_ref     text,
	last_error       text,
	resolved_by      text,
	resolution_note  text,
	resolved_at      timestamptz,
	created_at       timestamptz NOT NULL DEFAULT now(),
	fired_at         timestamptz,
	confirmed_at     timestamptz,
	updated_at       timestamptz NOT NULL DEFAULT now(),
	CONSTRAINT side_effects_source_kind_key UNIQUE (source_id, kind),
	CONSTRAINT side_effects_state_check CHECK (state IN ('pending', 'fired', 'confirmed', 'failed', 'unknown'))
);

-- One index drives the dispatcher: next_attempt_at is when a row is next
-- looked at, the due time while pending and the lease expiry while fired.
-- Claims scan it for due pending rows, recovery for expired fired rows; a
-- confirmed or failed row leaves it. (Fewer indexes make the two updates per
-- effect cheaper: they cannot be HOT updates.)
CREATE INDEX side_effects_due ON {schema}.side_effects (next_attempt_at) WHERE state IN ('pending', 'fired');
-- Rows that need an operator.
CREATE INDEX side_effects_unknown ON {schema}.side_effects (kind) WHERE state = 'unknown';
-- Retention deletes terminal rows by age; rows are appended in time order,
-- so a BRIN index is enough and costs next to nothing to maintain.
CREATE INDEX side_effects_created ON {schema}.side_effects USING brin (created_at);
