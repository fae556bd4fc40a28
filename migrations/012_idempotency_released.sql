-- A key whose first request ended without a stored response (a 5xx, 429,
-- 401 or 403, a panic) is kept as 'released' until it expires: it holds that
-- request's fingerprint, so that another body under the key is refused
-- (422) as in every other state, while the same body runs again.
ALTER TABLE {schema}.idempotency_keys DROP CONSTRAINT idempotency_keys_state;
ALTER TABLE {schema}.idempotency_keys ADD CONSTRAINT idempotency_keys_state
	CHECK (state IN ('in_progress', 'completed', 'released'));

-- Cleanup deletes expired released records as it deletes completed ones.
DROP INDEX {schema}.idempotency_keys_expired;
CREATE INDEX idempotency_keys_expired ON {schema}.idempotency_keys (expires_at) WHERE state <> 'in_progress';
