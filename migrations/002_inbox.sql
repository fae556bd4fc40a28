-- The inbox: one claim per (consumer, event ID), written in the same
-- transaction as the handler's effects, so a redelivered or republished event
-- finds its claim and is acknowledged as a duplicate.
CREATE TABLE {schema}.processed_messages (
	consumer     text COLLATE "C" NOT NULL,
	message_id   uuid        NOT NULL,
	processed_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, message_id)
);

-- Retention deletes by age. Rows arrive in time order, so a BRIN index is
-- enough and costs next to nothing on insert.
CREATE INDEX processed_messages_processed_at ON {schema}.processed_messages USING brin (processed_at);

-- Messages a consumer gave up on: permanent handler errors, undecodable
-- messages, messages without a valid ID, messages past the attempt limit.
-- message_id is the raw ID as delivered (it may be missing or invalid).
-- replayed_at is set when `oncekit dlq replay` republished the message.
CREATE TABLE {schema}.dead_letters (
	id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	consumer    text        NOT NULL,
	message_id  text        NOT NULL DEFAULT '',
	subject     text        NOT NULL,
	payload     bytea       NOT NULL,
	headers     jsonb       NOT NULL DEFAULT '{}',
	reason      text        NOT NULL,
	attempts    integer     NOT NULL,
	created_at  timestamptz NOT NULL DEFAULT now(),
	replayed_at timestamptz
);

-- A redelivered poison message (its ack was lost) does not make a second row.
CREATE UNIQUE INDEX dead_letters_pending_message ON {schema}.dead_letters (consumer, message_id)
	WHERE replayed_at IS NULL AND message_id <> '';
CREATE INDEX dead_letters_created_at ON {schema}.dead_letters (created_at);
