-- What operators did through the console: who, when, what, on what and how
-- many. Rows are only ever inserted.
CREATE TABLE {schema}.console_audit (
	id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	at       timestamptz NOT NULL DEFAULT now(),
	operator text        NOT NULL,
	action   text        NOT NULL,
	target   text        NOT NULL,
	count    integer     NOT NULL,
	note     text        NOT NULL DEFAULT ''
);

-- The console's chain looks a message up at every layer by its ID: a dead
-- letter by its message's ID, and an effect by its idempotency key.
CREATE INDEX dead_letters_message_id ON {schema}.dead_letters (message_id);
CREATE INDEX side_effects_idempotency_key ON {schema}.side_effects (idempotency_key);

-- The dead letters waiting for a replay, newest last: the inbox page groups
-- the latest of them, and a table of replayed ones is never read for it.
CREATE INDEX dead_letters_waiting ON {schema}.dead_letters (created_at) WHERE replayed_at IS NULL;
