-- The dispatcher's claim (pending -> fired) becomes a HOT update: it writes
-- no index entry, only a new row version on the same page.
--
-- PostgreSQL can update a row in place (HOT) when no indexed column changes,
-- counting the columns of partial-index predicates, and the page has room.
-- Until now the claim changed both: state, which the due and unknown indexes
-- filtered on, and next_attempt_at, which became the lease expiry. Each claim
-- wrote an entry into every index of the table.
--
-- From here on, next_attempt_at says when the dispatcher next looks at a row,
-- and no index refers to state:
--   pending         the due time;
--   fired           the due time it was claimed at, unchanged by the claim
--                   (the lease is lease_expires_at alone; recovery finds
--                   expired leases among the due rows), or the time of the
--                   next try after an indefinite error;
--   unknown         'infinity': only an operator moves it on;
--   confirmed,
--   failed          NULL: the row has left the due index.
-- The unknown rows are counted through the due index, at 'infinity'.
--
-- A fillfactor of 50 leaves each page room for the claimed versions of its
-- rows: the dispatcher claims rows recorded together, which share pages.
-- It applies to pages written from now on.
--
-- The settled rows are rewritten once (next_attempt_at set to NULL or
-- 'infinity') under a lock on side_effects: on a large ledger, purge old
-- rows first, and apply this migration while dispatchers are stopped.
ALTER TABLE {schema}.side_effects ALTER COLUMN next_attempt_at DROP NOT NULL;
UPDATE {schema}.side_effects SET next_attempt_at = NULL WHERE state IN ('confirmed', 'failed');
UPDATE {schema}.side_effects SET next_attempt_at = 'infinity' WHERE state = 'unknown';
DROP INDEX {schema}.side_effects_due;
DROP INDEX {schema}.side_effects_unknown;
CREATE INDEX side_effects_due ON {schema}.side_effects (next_attempt_at) WHERE next_attempt_at IS NOT NULL;
ALTER TABLE {schema}.side_effects SET (fillfactor = 50);
