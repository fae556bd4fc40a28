-- The due index carries each effect's ID after its due time, so that the
-- console pages the unknown effects (all due at 'infinity') in ID order
-- through it, a page at a time however many wait, instead of reading and
-- sorting them all (decision 025). Only live effects are in it (settled
-- ones have no due time), so it is rebuilt from the live effects alone. An
-- effect's ID never changes: the claims' updates stay HOT (decision 014).
DROP INDEX {schema}.side_effects_due;
CREATE INDEX side_effects_due ON {schema}.side_effects (next_attempt_at, id) WHERE next_attempt_at IS NOT NULL;
