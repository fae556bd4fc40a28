-- A message from outside may carry what a text or jsonb column refuses: an ID
-- or subject that is not valid UTF-8, a NUL byte in a header, an ID of several
-- kilobytes (wider than an index row may be). The text columns hold such a
-- value made storable (invalid bytes as U+FFFD, an ID cut and followed by a
-- hash of its bytes, so two raw IDs never share a row); the exact bytes go
-- here, for `oncekit dlq show` and for a replay. NULL means the text column
-- holds the value exactly, as it does for every message oncekit published.
-- Adding nullable columns without a default rewrites nothing.
ALTER TABLE {schema}.dead_letters
	ADD COLUMN raw_message_id bytea,
	ADD COLUMN raw_subject    bytea,
	ADD COLUMN raw_headers    bytea;
