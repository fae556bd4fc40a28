-- Where the logical relay's slot stood, as the relay last recorded it (at
-- most once a StatusInterval, when its confirmed position moved): the
-- position, when, and the server's timeline and system identifier. The
-- table is replicated, so a promoted standby has the record while a
-- PostgreSQL before 17 has no slot there: the relay then names the window
-- of events that may be missing (from confirmed_lsn to the timeline's
-- switch point) instead of streaming from a new slot.
ALTER TABLE {schema}.logical_slots
	ADD COLUMN confirmed_lsn pg_lsn,
	ADD COLUMN confirmed_at  timestamptz,
	ADD COLUMN timeline      int8,
	ADD COLUMN system_id     text;
